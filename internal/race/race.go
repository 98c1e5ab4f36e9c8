//go:build race

// Package race says whether the binary was built with -race: allocation
// and timing guards do not hold under the race detector's instrumentation.
package race

// Enabled is true when the binary was built with -race.
const Enabled = true
