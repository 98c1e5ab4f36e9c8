//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRewriteKeepsAddressesApart: the rewrite of nginx/ replaces each
// shipped address once, whole. The test servers listen on random ports, so
// an app on 127.0.0.1:41809 begins with the auth layer's shipped
// 127.0.0.1:4180: replaced in turn, the app's line became
// "server 127.0.0.1:398839;" and nginx refused to start (a CI run failed
// TestFailureMapOnURI so).
func TestRewriteKeepsAddressesApart(t *testing.T) {
	prefix := t.TempDir()
	copyNginxDir(t, prefix, rewrite{
		rategates: []string{"127.0.0.1:41801"},
		app:       "127.0.0.1:41809",
		auth:      "127.0.0.1:39883",
	})
	b, err := os.ReadFile(filepath.Join(prefix, "nginx-auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	for _, want := range []string{"server 127.0.0.1:41809;", "server 127.0.0.1:39883;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nginx-auth.conf after the rewrite has no %q", want)
		}
	}
	for _, line := range strings.Split(conf, "\n") {
		if strings.Contains(line, "398839") || strings.Contains(line, "3988301") || strings.Contains(line, "3988309") {
			t.Errorf("an address rewritten twice: %q", strings.TrimSpace(line))
		}
	}
	up, err := os.ReadFile(filepath.Join(prefix, "rategate-upstream.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(up), "127.0.0.1:41801") || strings.Contains(string(up), "127.0.0.1:8080") {
		t.Errorf("rategate-upstream.conf does not name the one rategate 127.0.0.1:41801")
	}
}
