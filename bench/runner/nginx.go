package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The shipped literals the copy rewrites (nginx/nginx.conf and
// nginx/rategate-upstream.conf). If one disappears the bench stops with a
// message instead of silently benchmarking another config.
const (
	shippedWorkers  = "worker_processes auto;"
	shippedListen   = "listen 8000;"
	shippedRategate = "127.0.0.1:8080"
	shippedApp      = "127.0.0.1:8001"
)

// nginxRewrite is how a copy of nginx/ differs from the shipped files:
// NGINX's listen address, the auth service's and the application's
// addresses, and one worker process. Every other line stays as shipped,
// unless keepalive (an experiment, BENCH_NGINX_KEEPALIVE) is set.
type nginxRewrite struct {
	listen int    // "listen 8000;" becomes "listen 127.0.0.1:<listen>;"
	auth   string // replaces 127.0.0.1:8080 (rategate, or the floor server)
	app    string // replaces 127.0.0.1:8001
	// keepalive, when > 0, replaces the number of idle connections each
	// upstream (rategate's and the app's) keeps per worker.
	keepalive int
}

// reKeepalive is an upstream's "keepalive N;" line.
var reKeepalive = regexp.MustCompile(`^(\s*keepalive )\d+;`)

// copyNginxDir copies the files of src (the repository's nginx/) into
// prefix, applying rw, and creates prefix/logs and prefix/temp.
func copyNginxDir(src, prefix string, rw nginxRewrite) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, d := range []string{"", "logs", "temp"} {
		p := filepath.Join(prefix, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		// NGINX's workers run as nobody when the master runs as root.
		if err := os.Chmod(p, 0o755); err != nil {
			return err
		}
	}
	hits := map[string]int{}
	for _, e := range entries {
		if e.IsDir() { // logs/ and temp/: created empty above
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		out := rewriteConf(string(b), rw, hits)
		if err := os.WriteFile(filepath.Join(prefix, e.Name()), []byte(out), 0o644); err != nil {
			return err
		}
	}
	lits := []string{shippedWorkers, shippedListen, shippedRategate, shippedApp}
	if rw.keepalive > 0 {
		lits = append(lits, "keepalive")
	}
	for _, lit := range lits {
		if hits[lit] == 0 {
			return fmt.Errorf("no line of %s contains %q any more: update bench/runner/nginx.go", src, lit)
		}
	}
	return nil
}

// rewriteConf applies rw to one file's text, counting each literal it
// replaced in hits. Comment lines are left alone.
func rewriteConf(text string, rw nginxRewrite, hits map[string]int) string {
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		repl := func(old, new string) {
			if strings.Contains(line, old) {
				line = strings.ReplaceAll(line, old, new)
				hits[old]++
			}
		}
		repl(shippedWorkers, "worker_processes 1;")
		repl(shippedListen, fmt.Sprintf("listen 127.0.0.1:%d;", rw.listen))
		repl(shippedRategate, rw.auth)
		repl(shippedApp, rw.app)
		if rw.keepalive > 0 && reKeepalive.MatchString(line) {
			line = reKeepalive.ReplaceAllString(line, "${1}"+strconv.Itoa(rw.keepalive)+";")
			hits["keepalive"]++
		}
		lines[i] = line
	}
	return strings.Join(lines, "\n")
}
