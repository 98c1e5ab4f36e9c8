package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// reloadSettingsConfig has the settings a reload must apply (failure_mode,
// deny_status, admin.token, identity) and one it cannot (redis.key_prefix).
const reloadSettingsConfig = `redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 200ms
failure_mode: %s
deny_status: %d
admin:
  token: %s
identity:
  user_header: %s
rules:
  - name: per-user
    key: [user]
    algorithm: sliding_log
    limit: 1
    period: 1h
`

// TestReloadAppliesSettings: a reload applies failure_mode, deny_status,
// admin.token and the identity headers, not only the rules; what needs a
// restart is named field by field in the answer, the CLI (exit 1) and the
// log, and keeps its running value.
func TestReloadAppliesSettings(t *testing.T) {
	t.Parallel()
	rs := testredis.StartControlled(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	prefix := uniquePrefix(t)
	writeFile(t, cfg, fmt.Sprintf(reloadSettingsConfig, rs.Addr, prefix, "allow", 429, "one", "X-User-Id"))
	p := startRategate(t, "settings", cfg, "one")

	ask := func(hdr, user string) int { return p.auth("X-Original-URI", "/", "X-Real-IP", "192.0.2.1", hdr, user) }
	if ask("X-User-Id", "ann") != 204 || ask("X-User-Id", "ann") != 429 {
		t.Fatal("before the reload: want 204 then 429")
	}

	// Everything that can be swapped, changed at once.
	writeFile(t, cfg, fmt.Sprintf(reloadSettingsConfig, rs.Addr, prefix, "deny", 403, "two", "X-Account"))
	admin := func(token string, args ...string) (int, string) {
		cmd := exec.Command(rategateBin(t), append([]string{"admin", "-addr", p.admin, "-token", token}, args...)...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, out.String()
	}
	code, out := admin("one", "reload")
	if code != 0 || !strings.Contains(out, "applied: failure_mode, admin.token, deny_status, identity.user_header") {
		t.Fatalf("reload: exit %d:\n%s", code, out)
	}
	// admin.token: the old one is refused now, the new one works.
	if code, out := admin("one", "rules"); code != 1 || !strings.Contains(out, "401") {
		t.Fatalf("old token after the reload: exit %d: %s", code, out)
	}
	p.token = "two"
	// identity.user_header and deny_status: the user now comes from
	// X-Account, and a denial is 403.
	if got := ask("X-Account", "bob"); got != 204 {
		t.Fatalf("bob's first request through the new header: %d", got)
	}
	if got := ask("X-Account", "bob"); got != 403 {
		t.Fatalf("bob's second request: %d, want 403 (deny_status)", got)
	}
	// failure_mode: with Redis gone, once the breaker is open, deny (503).
	rs.Kill()
	within(t, 5*time.Second, "failure_mode deny answers", func() error {
		if got := ask("X-Account", fmt.Sprintf("u%d", time.Now().UnixNano())); got != 503 {
			return fmt.Errorf("status %d, want 503", got)
		}
		return nil
	})
	rs.RestartEmpty(t)

	// A setting that takes a restart: named, 409, CLI exit 1, logged; the
	// running value stays.
	writeFile(t, cfg, fmt.Sprintf(reloadSettingsConfig, rs.Addr, prefix+"x", "deny", 403, "two", "X-Account"))
	code, out = admin("two", "reload")
	if code != 1 || !strings.Contains(out, "take a restart") || !strings.Contains(out, "redis.key_prefix") {
		t.Fatalf("reload with a changed key_prefix: exit %d, want 1 naming redis.key_prefix:\n%s", code, out)
	}
	status, body := p.do("POST", "http://"+p.admin+"/v1/reload", "two", nil)
	var res struct {
		Result      string   `json:"result"`
		NeedRestart []string `json:"need_restart"`
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil || status != 409 || res.Result != "partial" ||
		len(res.NeedRestart) != 1 || res.NeedRestart[0] != "redis.key_prefix" {
		t.Fatalf("POST /v1/reload: %d %s", status, body)
	}
	log, _ := os.ReadFile(p.rg.LogPath)
	if !strings.Contains(string(log), `"need_restart":["redis.key_prefix"]`) {
		t.Fatalf("no log line naming the field that needs a restart:\n%s", p.logTail())
	}
}
