//go:build !linux

package testredis

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
