//go:build race

package limits

// raceOn is true when the tests run with -race.
const raceOn = true
