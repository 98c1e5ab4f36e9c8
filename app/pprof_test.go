package app

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
)

// TestPprof: the profiles are served only when asked for, and behind the
// admin token like every other admin path.
func TestPprof(t *testing.T) {
	start := func(pprof bool, token string) *fasthttp.HostClient {
		cfg := config.Example()
		cfg.Admin.Token = token
		a, err := New(cfg, Options{Log: zerolog.Nop(), Pprof: pprof})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		return serveOn(t, a.AdminHandler())
	}
	off := start(false, "")
	code, body := call(t, off, "GET", "/debug/pprof/heap", "")
	if code != 404 || !strings.Contains(body, "-pprof") {
		t.Fatalf("pprof off: %d %s, want 404 naming -pprof", code, body)
	}

	on := start(true, "tok")
	if code, _ := call(t, on, "GET", "/debug/pprof/heap", ""); code != 401 {
		t.Fatalf("pprof without token: %d, want 401", code)
	}
	code, body = call(t, on, "GET", "/debug/pprof/", "", "Authorization", "Bearer tok")
	if code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("pprof index: %d %.200s", code, body)
	}
	code, body = call(t, on, "GET", "/debug/pprof/goroutine?debug=1", "", "Authorization", "Bearer tok")
	if code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("goroutine profile: %d %.200s", code, body)
	}
	code, body = call(t, on, "GET", "/debug/pprof/profile?seconds=1", "", "Authorization", "Bearer tok")
	if code != 200 || len(body) < 50 {
		t.Fatalf("cpu profile: %d, %d bytes", code, len(body))
	}
}
