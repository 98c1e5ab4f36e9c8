// Package faults is rategate's fault-injection suite. Its tests build the
// rategate binary once, run it as a real process against a real
// redis-server, and then break Redis the ways production does — SIGKILL,
// SIGSTOP, DEBUG SLEEP, a busy Lua script, a restart with and without its
// data, SCRIPT FLUSH — while a load generator measures every answer. Other
// tests throw garbage and slow-loris clients at a live instance and check
// that memory, goroutines and connections come back to their baseline.
//
// It runs in `make test` (plain `go test ./faults/`), in about a minute.
// Every wait is bounded; a missing redis-server fails the suite with the
// command that installs it. Timing bounds are checked on rategate's own
// histogram where it can say (the 1ms of an open breaker) and at the
// client otherwise; an outage whose measurement misses a bound is measured
// again, up to three times, because a busy two-core machine can stall any
// process for longer than the bounds allow, while a real fault fails every
// attempt.
package faults
