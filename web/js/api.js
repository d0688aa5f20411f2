/* api: every request the dashboard makes to the coordinator's REST API.
 *
 * The token: when the coordinator runs with --token-file, every /v1 call
 * needs "Authorization: Bearer <token>". On the first 401 the page asks
 * for the token (a modal dialog), keeps it in sessionStorage (gone when
 * the tab closes) and retries; every later request sends it. Concurrent
 * 401s share one prompt. Downloads (checkpoint, Chrome trace) go through
 * fetch as well, so they carry the header too.
 *
 * Errors: the API answers {"error": {"code", "message", "path"}}; request()
 * rejects with a PW.api.Error carrying those fields and the HTTP status.
 * A 429 (the coordinator's pool for plans and timelines is full) is retried
 * after its Retry-After, up to five times. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.api = (function () {
  var KEY = "pipewright.token";
  var asking = null; /* the pending token prompt, shared */

  function ApiError(status, code, message, path) {
    this.name = "ApiError";
    this.status = status;
    this.code = code || "http_" + status;
    this.message = message || "HTTP " + status;
    this.path = path || "";
  }
  ApiError.prototype = Object.create(Error.prototype);
  ApiError.prototype.toString = function () {
    return this.message + (this.path ? " (at " + this.path + ")" : "");
  };

  function token() {
    try { return sessionStorage.getItem(KEY) || ""; } catch (e) { return ""; }
  }
  function setToken(t) {
    try {
      if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY);
    } catch (e) { /* storage disabled: the token lives for this request only */ }
    mem = t;
    var f = document.getElementById("token-forget");
    if (f) f.hidden = !t;
  }
  var mem = "";

  /* Show the token dialog; resolves with the token, or null when the user
   * cancels. */
  function askToken(hadToken) {
    if (asking) return asking;
    var dlg = document.getElementById("token-dialog");
    var input = document.getElementById("token-input");
    var reason = document.getElementById("token-reason");
    if (!dlg || typeof dlg.showModal !== "function") {
      var t = window.prompt("API token (Authorization: Bearer)") || null;
      if (t) setToken(t.trim());
      return Promise.resolve(t);
    }
    reason.textContent = hadToken ? "The API refused the token. Enter another one."
                                  : "This coordinator requires an API token.";
    input.value = "";
    asking = new Promise(function (resolve) {
      function done() {
        dlg.removeEventListener("close", done);
        var t = dlg.returnValue === "ok" ? input.value.trim() : "";
        asking = null;
        if (t) { setToken(t); resolve(t); } else resolve(null);
      }
      dlg.addEventListener("close", done);
      dlg.returnValue = ""; /* Escape closes without setting it */
      dlg.showModal();
      input.focus();
    });
    return asking;
  }

  function headers(extra) {
    var hd = {"Accept": "application/json"};
    var t = token() || mem;
    if (t) hd["Authorization"] = "Bearer " + t;
    if (extra) Object.keys(extra).forEach(function (k) { hd[k] = extra[k]; });
    return hd;
  }

  async function errorOf(resp) {
    var body = null;
    try { body = await resp.json(); } catch (e) { /* not JSON */ }
    var e = body && body.error ? body.error : {};
    return new ApiError(resp.status, e.code, e.message || resp.statusText, e.path);
  }

  /* fetch with the token; asks for one on 401 and retries. Resolves with
   * the Response when it is ok, rejects with ApiError otherwise. */
  async function send(method, path, body) {
    for (var busy = 0;; busy++) {
      var init = {method: method, headers: headers(body !== undefined ? {"Content-Type": "application/json"} : null),
                  cache: "no-store"};
      if (body !== undefined) init.body = typeof body === "string" ? body : JSON.stringify(body);
      var resp;
      try {
        resp = await fetch(path, init);
      } catch (e) {
        throw new ApiError(0, "unreachable", "coordinator unreachable: " + e.message);
      }
      if (resp.status === 401) {
        var had = !!(token() || mem);
        var t = await askToken(had);
        if (t) continue;
        throw await errorOf(resp);
      }
      /* the pool of expensive requests is full (plans, timelines): it says
       * when to come back; a few tries before showing the error */
      if (resp.status === 429 && busy < 5) {
        var after = Math.min(5, Math.max(1, parseInt(resp.headers.get("Retry-After"), 10) || 1));
        await new Promise(function (r) { setTimeout(r, after * 1000); });
        continue;
      }
      if (!resp.ok) throw await errorOf(resp);
      return resp;
    }
  }

  async function json(method, path, body) {
    var resp = await send(method, path, body);
    if (resp.status === 204) return null;
    return resp.json();
  }

  /* Download a file from the API under a name (keeps the token out of the
   * URL). */
  async function download(path, filename) {
    var resp = await send("GET", path);
    var cd = resp.headers.get("Content-Disposition") || "";
    var m = /filename="?([^";]+)"?/.exec(cd);
    var blob = await resp.blob();
    var url = URL.createObjectURL(blob);
    var a = document.createElement("a");
    a.href = url;
    a.download = (m && m[1]) || filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 10000);
  }

  return {
    Error: ApiError,
    token: token,
    setToken: setToken,
    get: function (path) { return json("GET", path); },
    post: function (path, body) { return json("POST", path, body === undefined ? {} : body); },
    del: function (path) { return json("DELETE", path); },
    send: send,
    download: download
  };
})();
