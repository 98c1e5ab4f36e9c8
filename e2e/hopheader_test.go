//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRuleOnHeaderNginxReplacesApplies: NGINX's proxy_pass, which carries
// the auth subrequest, sends Host as the upstream's name ("rategate") and
// drops Upgrade, Connection, Keep-Alive, TE and Expect, whatever the client
// sent. A rule on match.header Host: api.example or Upgrade: websocket was
// accepted and never matched behind the shipped nginx.conf: 6 of 6
// requests admitted at a limit of 3, for each. rategate -check refuses
// such rules now, naming what reads the client's host instead; the rule
// it names (match.host) holds through the same NGINX.
func TestRuleOnHeaderNginxReplacesApplies(t *testing.T) {
	refused := `    - name: api-host
      match: {path: /h/, header: {Host: api.example}}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
    - name: websocket
      match: {path: /ws/, header: {Upgrade: websocket}}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
`
	file := filepath.Join(t.TempDir(), "rategate.yaml")
	if err := os.WriteFile(file, []byte(policy(429, "hop", "", refused)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(rategateBinary(t), "-check", "-config", file).CombinedOutput()
	if err == nil {
		t.Fatalf("rategate -check accepted rules on match.header Host and Upgrade, which never match behind NGINX:\n%s", out)
	}
	for _, want := range []string{`match.header "Host"`, "use match.host", `match.header "Upgrade"`, "proxy_set_header X-Client-Upgrade $http_upgrade"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rategate -check output lacks %q:\n%s", want, out)
		}
	}

	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "hop", "", `    - name: api-host
      match: {path: /h/, host: api.example}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
`))
	nx := startNginx(t, "hop", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
	needWindow(t, window, 30*time.Second)
	req := request{Path: "/h/x", From: "127.0.41.10", Header: []string{"Host: api.example"}}
	admitted := 0
	for range 6 {
		if nx.do(t, req).Status == 200 {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("match.host api.example, limit 3: %d of 6 requests with Host: api.example admitted, want 3", admitted)
	}
	other := 0
	for range 6 {
		if nx.do(t, request{Path: "/h/x", From: "127.0.41.11", Header: []string{"Host: other.example"}}).Status == 200 {
			other++
		}
	}
	if other != 6 {
		t.Errorf("match.host api.example: %d of 6 requests for another host admitted, want all (the rule is not theirs)", other)
	}
}
