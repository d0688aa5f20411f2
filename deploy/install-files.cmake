# install-files.cmake: install-time steps of CMakeLists.txt's install
# section, for the prefix actually installed into (`--prefix`, cpack's
# /usr). The caller sets PW_SRC, PW_BIN (source and build dirs), PW_CONFDIR
# and PW_UNITDIR (the cache values) and calls one of the functions below.
# file(INSTALL) adds DESTDIR itself; the paths written into units and
# configuration never have it.

set(PW_PREFIX "${CMAKE_INSTALL_PREFIX}")
if(NOT PW_CONFDIR)
  if(PW_PREFIX STREQUAL "/usr" OR PW_PREFIX STREQUAL "/usr/local")
    set(PW_CONFDIR /etc/pipewright)
  else()
    set(PW_CONFDIR "${PW_PREFIX}/etc/pipewright")
  endif()
endif()
set(PW_BINDIR "${PW_PREFIX}/bin")
set(PW_DATADIR "${PW_PREFIX}/share/pipewright")
# Files are filled in in a folder of this install's own (installs running
# at once, as tests do, never share one), removed once installed.
string(RANDOM LENGTH 12 PW_KEY)
set(PW_OUT "${PW_BIN}/deploy/install-${PW_KEY}")
if(NOT IS_ABSOLUTE "${PW_UNITDIR}")
  set(PW_UNITDIR "${PW_PREFIX}/${PW_UNITDIR}")
endif()

# A systemd unit from deploy/NAME.in with its @PW_...@ paths filled in.
function(pw_install_unit name)
  configure_file("${PW_SRC}/deploy/${name}.in" "${PW_OUT}/${name}" @ONLY)
  file(INSTALL "${PW_OUT}/${name}" DESTINATION "${PW_UNITDIR}"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  file(REMOVE_RECURSE "${PW_OUT}")
endfunction()

# CONFDIR/NAME from deploy/NAME, as a package ships it (a conffile: dpkg
# keeps an operator's edits). A plain install leaves it to install.sh setup.
function(pw_install_conf name)
  configure_file("${PW_SRC}/deploy/${name}" "${PW_OUT}/${name}" @ONLY)
  file(INSTALL "${PW_OUT}/${name}" DESTINATION "${PW_CONFDIR}"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  file(REMOVE_RECURSE "${PW_OUT}")
endfunction()

# deploy/install.sh setup: configuration and tokens when absent; users,
# groups and systemd only for a real system install.
function(pw_install_setup)
  set(system no)
  if("$ENV{DESTDIR}" STREQUAL "" AND PW_CONFDIR MATCHES "^/etc/")
    set(system yes)
  endif()
  execute_process(COMMAND sh "${PW_SRC}/deploy/install.sh" setup
                          --confdir "${PW_CONFDIR}" --templates "${PW_SRC}/deploy"
                          --datadir "${PW_DATADIR}" --destdir "$ENV{DESTDIR}" --system ${system}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "deploy/install.sh setup failed (${rc})")
  endif()
endfunction()
