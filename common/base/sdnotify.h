/* sdnotify: tell the service manager how a daemon is doing, by systemd's
 * documented notification protocol (sd_notify(3)), without libsystemd.
 *
 * The manager passes a datagram socket's address in $NOTIFY_SOCKET: a path
 * ("/run/systemd/notify") or, when it starts with '@', a name in Linux's
 * abstract namespace. A notification is one AF_UNIX datagram of
 * newline-separated KEY=VALUE lines: READY=1 once serving, STATUS=... for a
 * one-line status `systemctl status` shows, STOPPING=1 when shutting down.
 *
 * Every call is a no-op returning 0 when $NOTIFY_SOCKET is unset or empty
 * (a daemon started by hand, or under Type=simple), so daemons call these
 * unconditionally. Nothing here ever blocks, raises SIGPIPE or aborts: a
 * failed notification is an error code, never a crash. */
#ifndef PW_SDNOTIFY_H
#define PW_SDNOTIFY_H

/* Send `state` (e.g. "READY=1\nSTATUS=serving") as one datagram.
 * Returns 1 when sent, 0 when $NOTIFY_SOCKET is unset or empty, and
 * PW_EINVAL for a NULL/empty state or an address that is neither an
 * absolute path nor '@'-abstract (or too long for sun_path), PW_EIO when
 * the socket cannot be made or the datagram is not delivered. */
int pw_sd_notify(const char *state);

/* pw_sd_notify of a formatted state, e.g. pw_sd_notifyf("STATUS=%d workers", n).
 * States longer than 4 KiB are refused with PW_EINVAL (never truncated). */
int pw_sd_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
