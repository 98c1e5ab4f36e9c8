package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits/storetest"
)

// within polls cond every 10ms for at most d; it returns the time it took,
// or fails with the last error.
func within(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resetsReady waits (bounded, generously) until a hears key resets through
// Redis pub/sub. The first subscription clears the deny cache (Resets.Run:
// resets published before it were missed), so a test that counts on a
// cached denial must not cache one before then. A no-op without a deny
// cache.
func resetsReady(t testing.TB, a *App) {
	t.Helper()
	if a.resets == nil {
		return
	}
	select {
	case <-a.resets.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription to the reset channel within 10 s")
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines counts the lines holding substr.
func (s *syncBuffer) lines(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// steadyHours writes the "period: 1h" of every fixed_window and
// sliding_window rule of a test's config as storetest.SteadyDuration() (1h
// and a few seconds or minutes, its window at least half an hour from its
// end when the test process started): a test that counts in an hour-long
// window on Redis's clock would find the limit whole again if it ran across
// the full hour. Rules of other algorithms have no window to turn over and
// keep their period.
func steadyHours(yaml string) string {
	blocks := strings.SplitAfter(yaml, "\n  - ")
	for i, b := range blocks {
		if strings.Contains(b, "algorithm: fixed_window\n") || strings.Contains(b, "algorithm: sliding_window\n") {
			blocks[i] = strings.ReplaceAll(b, "period: 1h\n", "period: "+storetest.SteadyDuration().String()+"\n")
		}
	}
	return strings.Join(blocks, "")
}

// fileApp starts an App on a config file holding yaml, logging to log, and
// returns it with a function that rewrites the file (for Reload).
func fileApp(t *testing.T, yaml string, log zerolog.Logger) (*App, func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(steadyHours(s)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(yaml)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, Options{Log: log, ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, write
}

// redisApp starts an App on yaml with set applied to the parsed config
// (its Redis, its key prefix), closed when the test ends, once its
// subscription to key resets is up.
func redisApp(t *testing.T, yaml string, set func(*config.Config)) *App {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(steadyHours(yaml)))
	if err != nil {
		t.Fatal(err)
	}
	set(cfg)
	a, err := New(cfg, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	resetsReady(t, a)
	return a
}
