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

// TestWatchForgetsACutReadOnce: a tool that rewrites the config in place
// with the same content (a config-management run, every run) is caught
// midway by the first rewrite: the cut is read once and, the write going on
// within a settle, never reloaded. The watcher kept that cut as "read
// once", and when the next rewrite was caught at the same point, a single
// read of the cut matched it and was reloaded ("cost: 10" read as "cost:
// 1"). A content now reloads only when read the same twice in a row.
func TestWatchForgetsACutReadOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	const full = "rules:\n  - name: api\n    key: [ip]\n    algorithm: gcra\n    limit: 100\n    period: 1h\n    cost: 10\n"
	cut := full[:len(full)-2] // "cost: 1"
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	rewrite := func() {
		// In place: truncate and write the first part, the rest 150 ms
		// later (past one settle, within two).
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(cut); err != nil {
			t.Fatal(err)
		}
		time.Sleep(watchSettle + watchSettle/2)
		if _, err := f.WriteString(full[len(cut):]); err != nil {
			t.Fatal(err)
		}
		f.Close()
		time.Sleep(5 * watchSettle) // settled: the content is as it was
	}
	rewrite()
	rewrite()
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		if s != full {
			t.Fatalf("reloaded %q, a file cut short (reloads: %q)", s, seen)
		}
	}
}
