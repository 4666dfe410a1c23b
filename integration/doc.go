// Package integration holds snapsvc's integration suite against a real snapd.
//
// The tests carry the build tag realsnapd and expect to run inside snapd's PID
// namespace (snapd refuses root clients whose pid it cannot resolve); run.sh
// boots Debian's snapd in a systemd-nspawn container, installs the svcdemo
// test snap and runs them there. See README.md in this directory.
package integration
