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

// TestWatchWaitsForAWriteToEnd: a tool rewriting the config in place is
// caught between two writes; what the watcher reads then is the file cut
// short, which can be a valid and more generous policy ("cost: 10" cut to
// "cost: 1"). A new content is reloaded only once it read the same twice a
// settle apart, so a write that goes on within that time is reloaded whole,
// and the cut never is.
func TestWatchWaitsForAWriteToEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	const full = "rules:\n  - name: api\n    key: [ip]\n    algorithm: gcra\n    limit: 100\n    period: 1h\n    cost: 10\n"
	cut := full[:len(full)-2] // "cost: 1"
	if err := os.WriteFile(path, []byte("rules: []\n"), 0o644); err != nil {
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
	// In place: truncate and write the first part, the rest 150 ms later
	// (past one settle, within two).
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := append([]string(nil), seen...)
		mu.Unlock()
		for _, s := range got {
			if s != full {
				t.Fatalf("reloaded %q, a file cut short", s)
			}
		}
		if len(got) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the whole file was never reloaded")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
