package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rs/zerolog"
)

// TestNeedRestartNamesEveryCoalesceField: a reload keeps the running
// redis.coalesce (the store is built once), so a change to any of its
// fields must be named as needing a restart, not dropped in silence. The
// fields are walked by reflection: a new one without its line in
// needRestart fails here.
func TestNeedRestartNamesEveryCoalesceField(t *testing.T) {
	a := &App{}
	prev := config.Example()
	typ := reflect.TypeOf(prev.Redis.Coalesce)
	for i := range typ.NumField() {
		next := config.Example()
		f := reflect.ValueOf(&next.Redis.Coalesce).Elem().Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Int64: // time.Duration
			f.SetInt(f.Int() + int64(time.Millisecond))
		default:
			t.Fatalf("field %s: kind %s, teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		got := a.needRestart(prev, next)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "redis.coalesce.") }) {
			t.Errorf("changing redis.coalesce's %s: needRestart named %v, want its redis.coalesce field", typ.Field(i).Name, got)
		}
	}
}

// TestMemoryMaxKeys: memory_max_keys bounds the in-memory store, a reload
// moves the bound at once, and its default is the store's own.
func TestMemoryMaxKeys(t *testing.T) {
	if got := memstore.DefaultMaxKeys; got != 1_000_000 {
		t.Fatalf("memstore.DefaultMaxKeys %d, want config's default 1,000,000", got)
	}
	c, err := config.Parse("t.yaml", []byte("rules: []\n"))
	if err != nil || c.MemoryMaxKeys != memstore.DefaultMaxKeys {
		t.Fatalf("default memory_max_keys %d (%v), want %d", c.MemoryMaxKeys, err, memstore.DefaultMaxKeys)
	}
	const rules = `rules:
  - name: per-route
    key: [route]
    algorithm: fixed_window
    limit: 5
    period: 1h
`
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	write := func(maxKeys int) {
		if err := os.WriteFile(path, fmt.Appendf(nil, "memory_max_keys: %d\n%s", maxKeys, rules), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(640)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, Options{Log: zerolog.Nop(), ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	mem := a.memoryStores()
	if len(mem) != 1 {
		t.Fatalf("%d memory stores without Redis, want 1", len(mem))
	}
	flood := func(from, to int) {
		var d limits.Decision
		for i := from; i < to; i++ {
			req := limits.Request{Route: []byte("/r/" + strconv.Itoa(i)), IP: []byte("192.0.2.1")}
			if err := a.Limiter().Decide(context.Background(), &req, &d); err != nil || !d.Admitted {
				t.Fatalf("request %d: admitted %v, %v", i, d.Admitted, err)
			}
		}
	}
	flood(0, 5000)
	if n := mem[0].Len(); n > 640 {
		t.Fatalf("%d keys after 5,000 routes with memory_max_keys 640", n)
	}
	write(6400)
	res, err := a.Reload("test")
	if err != nil || !slices.Contains(res.Applied, "memory_max_keys") {
		t.Fatalf("reload: %+v, %v; want memory_max_keys applied", res, err)
	}
	flood(5000, 10000)
	if n := mem[0].Len(); n <= 640 || n > 6400 {
		t.Fatalf("%d keys after 5,000 more routes with memory_max_keys 6400, want more than 640 and at most 6400", n)
	}
}
