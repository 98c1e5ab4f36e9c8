package testredis

import "syscall"

// childAttr makes a server die with the test binary even when the binary
// itself is killed (a panic in another goroutine, a -timeout), so no
// redis-server outlives the tests that started it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
