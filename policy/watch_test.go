package policy

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// watchFull and watchCut are a policy and the same file cut short inside a
// line, as a tool rewriting the file in place leaves it between two
// writes: a valid, more generous policy ("cost: 10" read as "cost: 1").
const watchFull = "rules:\n  - name: api\n    key: [ip]\n    algorithm: gcra\n    limit: 100\n    period: 1h\n    cost: 10\n"

var watchCut = watchFull[:len(watchFull)-2]

// watched writes initial to a config file, watches it, and returns its
// path and what each reload read.
func watched(t *testing.T, initial string) (string, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	if err := os.WriteFile(path, []byte(initial), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var mu sync.Mutex
	var seen []string
	if err := Watch(ctx, path, zerolog.Nop(), func() {
		b, _ := os.ReadFile(path)
		mu.Lock()
		seen = append(seen, string(b))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return path, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// rewriteInPlace truncates path and writes watchCut, then the rest 150 ms
// later (past one settle, within two).
func rewriteInPlace(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(watchCut); err != nil {
		t.Fatal(err)
	}
	time.Sleep(watchSettle + watchSettle/2)
	if _, err := f.WriteString(watchFull[len(watchCut):]); err != nil {
		t.Fatal(err)
	}
}

// noCut fails t if a reload read anything but watchFull.
func noCut(t *testing.T, seen []string) {
	t.Helper()
	for _, s := range seen {
		if s != watchFull {
			t.Fatalf("reloaded %q, a file cut short (reloads: %q)", s, seen)
		}
	}
}

// TestWatchWaitsForAWriteToEnd: a tool rewriting the config in place is
// caught between two writes. A new content is reloaded only once it read
// the same twice a settle apart, so a write that goes on within that time
// is reloaded whole, and the cut never is.
func TestWatchWaitsForAWriteToEnd(t *testing.T) {
	path, seen := watched(t, "rules: []\n")
	rewriteInPlace(t, path)
	deadline := time.Now().Add(5 * time.Second)
	for len(seen()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the whole file was never reloaded")
		}
		time.Sleep(20 * time.Millisecond)
	}
	noCut(t, seen())
}

// TestWatchForgetsACutReadOnce: a tool that rewrites the config in place
// with the same content (a config-management run, every run) is caught
// midway: the cut is read once and, the write going on within a settle,
// never reloaded. The watcher kept that cut as "read once", and when the
// next rewrite was caught at the same point, a single read of the cut
// matched it and was reloaded. A content reloads only when read the same
// twice in a row.
func TestWatchForgetsACutReadOnce(t *testing.T) {
	path, seen := watched(t, watchFull)
	for range 2 {
		rewriteInPlace(t, path)
		time.Sleep(5 * watchSettle) // settled: the content is as it was
	}
	noCut(t, seen())
}
