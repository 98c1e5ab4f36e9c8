// Package e2e is rategate's end-to-end suite: a real redis-server, two
// rategate processes sharing it, real nginx running every shipped config in
// nginx/ (plain auth_request, the quiet 403 mapping, access_by_lua), and a
// tiny upstream application, all on free loopback ports, driven with the
// curl binary. It asserts what a client sees.
//
// The tests only build with the e2e tag, so `go test ./...` skips them:
//
//	go test -tags e2e -count=1 -timeout 10m ./e2e/     # or: make e2e
//
// A missing nginx, redis-server, curl or docker-compose binary fails the
// suite with the apt-get command that installs it. Set RATEGATE_E2E_KEEP=1
// to keep the work directory (configs, nginx and rategate logs) after a run,
// and RATEGATE_BINARY=path to test a prebuilt rategate instead of
// building one from the repository.
package e2e
