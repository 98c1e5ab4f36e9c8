// Package lua embeds rategate's Redis scripts. Each lua/<algorithm>.lua runs
// on its own with redis-cli --eval; Decide joins their functions with
// decide.lua into the one script that decides a whole request.
package lua

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.lua
var files embed.FS

// Algorithm scripts in the order of their numeric code in decide.lua (1-based).
var algorithmFiles = []struct{ file, fn string }{
	{"fixed_window.lua", "fixed_window"},
	{"sliding_log.lua", "sliding_log"},
	{"sliding_window.lua", "sliding_window"},
	{"gcra.lua", "gcra"},
	{"token_bucket.lua", "token_bucket"},
}

const standaloneMarker = "-- @standalone"

// Source returns the full text of one embedded script.
func Source(name string) (string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("lua: %w", err)
	}
	return string(b), nil
}

// Decide returns the multi-rule script: every available algorithm's function
// followed by decide.lua. Algorithms whose file is absent are left out of the
// table (their code then errors in the script).
func Decide() (string, error) {
	var sb strings.Builder
	table := make([]string, 0, len(algorithmFiles))
	for i, a := range algorithmFiles {
		src, err := Source(a.file)
		if err != nil {
			table = append(table, fmt.Sprintf("[%d] = nil", i+1))
			continue
		}
		cut := strings.Index(src, standaloneMarker)
		if cut < 0 {
			return "", fmt.Errorf("lua: %s has no %q line", a.file, standaloneMarker)
		}
		sb.WriteString(src[:cut])
		sb.WriteString("\n")
		table = append(table, fmt.Sprintf("[%d] = %s", i+1, a.fn))
	}
	drv, err := Source("decide.lua")
	if err != nil {
		return "", err
	}
	sb.WriteString(strings.Replace(drv, "ALGORITHM_TABLE", strings.Join(table, ", "), 1))
	return sb.String(), nil
}

// Code returns the numeric code decide.lua uses for an algorithm name, or 0.
func Code(algorithm string) int {
	for i, a := range algorithmFiles {
		if a.fn == algorithm {
			return i + 1
		}
	}
	return 0
}
