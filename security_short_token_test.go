package main

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
)

// TestShortAdminTokenRefusedOffLoopback: on an admin listener reachable
// from other hosts the token is the only guard of overrides, key resets,
// identity blocks and reloads, and nothing limits how fast a client may
// guess it (every wrong guess is a cheap 401). A token of one character is
// found in at most 256 requests; rategate must refuse it at start as it
// refuses an empty one. Instead it starts, and the test guesses the token.
func TestShortAdminTokenRefusedOffLoopback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, "rules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 5\n    period: 1m\n")
	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const token = "k"
	rg, err := procs.StartRategate(procs.Options{
		Name: "short-token", Bin: rategateBin(t), Dir: t.TempDir(),
		Admin: "0.0.0.0:" + strconv.Itoa(port), Token: token, Ready: "none",
		Args: []string{"-config", cfg},
		Env:  []string{"RATEGATE_ADMIN_TOKEN=" + token},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.Kill)
	select {
	case <-rg.Done():
		return // refused: what the contract wants
	case <-time.After(3 * time.Second):
	}
	p := &proc{t: t, name: "short-token", main: rg.Main, admin: rg.Admin, rg: rg}
	for c := 0; c < 256; c++ {
		guess := string(rune(c))
		if c < 0x21 || c > 0x7e {
			continue
		}
		if code, _ := p.get("http://"+p.admin+"/v1/rules", guess); code == 200 {
			t.Fatalf("rategate started with a %d-byte admin token on %s and a client guessed it (%q) in at most %d requests; want a refusal at start for a token this short",
				len(token), p.admin, guess, c-0x20)
		}
	}
	t.Fatalf("rategate started with a %d-byte admin token on %s; want a refusal at start", len(token), p.admin)
}
