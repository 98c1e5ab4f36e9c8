//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rategate/rategate/internal/testredis"
)

// composeFile is the part of docker-compose.yml the checks read.
type composeFile struct {
	Services map[string]struct {
		Build       yaml.Node         `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []yaml.Node       `yaml:"volumes"`
		Networks    []string          `yaml:"networks"`
	} `yaml:"services"`
}

// TestComposeFile validates docker-compose.yml without a Docker engine:
// docker-compose parses it, and everything it builds or mounts exists.
func TestComposeFile(t *testing.T) {
	path := filepath.Join(repoRoot, "docker-compose.yml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(b, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(cf.Services) == 0 {
		t.Fatal("docker-compose.yml has no services")
	}

	t.Run("docker-compose config accepts it", func(t *testing.T) {
		bin := needBinary(t, "docker-compose", "docker-compose")
		cmd := exec.Command(bin, "-f", path, "config", "-q")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "RATEGATE_ADMIN_TOKEN=0123456789abcdef")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker-compose config: %v\n%s", err, out)
		}
		// Without a token it refuses, naming the variable: the admin
		// listener is on the compose network.
		cmd = exec.Command(bin, "-f", path, "config", "-q")
		cmd.Dir = repoRoot
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "RATEGATE_ADMIN_TOKEN=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "RATEGATE_ADMIN_TOKEN") {
			t.Errorf("docker-compose config without RATEGATE_ADMIN_TOKEN: %v\n%s", err, out)
		}
	})

	t.Run("Prometheus scrapes the rategate service with the token", func(t *testing.T) {
		rg, prom := cf.Services["rategate"], cf.Services["prometheus"]
		if !strings.Contains(strings.Join(rg.Command, " "), "-admin-listen 0.0.0.0:9090") {
			t.Errorf("rategate: the admin listener is not on the compose network: %q", rg.Command)
		}
		for name, env := range map[string]map[string]string{"rategate": rg.Environment, "prometheus": prom.Environment} {
			if !strings.HasPrefix(env["RATEGATE_ADMIN_TOKEN"], "${RATEGATE_ADMIN_TOKEN:?") {
				t.Errorf("%s: RATEGATE_ADMIN_TOKEN is %q, want the required variable", name, env["RATEGATE_ADMIN_TOKEN"])
			}
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose", "prometheus.yml"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := string(b)
		if !strings.Contains(cfg, `targets: ["rategate:9090"]`) {
			t.Error("deploy/compose/prometheus.yml does not scrape rategate:9090")
		}
		// The token file the config reads is the one the entrypoint writes.
		if !strings.Contains(cfg, "credentials_file: /prometheus/rategate-token") || !strings.Contains(strings.Join(prom.Command, " "), "> /prometheus/rategate-token") {
			t.Errorf("prometheus: the token file of prometheus.yml is not the one its command writes: %q", prom.Command)
		}
	})

	t.Run("Redis shares a network with rategate alone", func(t *testing.T) {
		// Whoever writes to rategate's Redis changes every limit
		// (overrides and identity blocks live there).
		redisNets := cf.Services["redis"].Networks
		if len(redisNets) == 0 {
			t.Fatal("redis: on the default network, with every other service")
		}
		for name, svc := range cf.Services {
			if name == "redis" || name == "rategate" {
				continue
			}
			for _, n := range svc.Networks {
				if slices.Contains(redisNets, n) {
					t.Errorf("%s shares the network %q with redis", name, n)
				}
			}
			if len(svc.Networks) == 0 {
				t.Errorf("%s: on the default network (give it its networks)", name)
			}
		}
	})

	t.Run("every path it builds or mounts exists", func(t *testing.T) {
		for name, svc := range cf.Services {
			if !svc.Build.IsZero() {
				context, dockerfile := buildPaths(t, name, &svc.Build)
				wantPath(t, name+" build context", context, true)
				df := filepath.Join(context, dockerfile)
				wantPath(t, name+" Dockerfile", df, false)
				wantDockerfileSources(t, df, context)
			}
			// container path -> host path, for the command's file arguments.
			mounts := map[string]string{}
			for _, v := range svc.Volumes {
				src, dst := volumePaths(&v)
				if src == "" {
					continue // a named volume
				}
				host := filepath.Join(repoRoot, src)
				wantPath(t, name+" volume "+src, host, false)
				mounts[strings.TrimSuffix(dst, "/")] = host
			}
			wantCommandFiles(t, name, svc.Command, mounts)
		}
	})

	t.Run("the rategate policy it mounts is valid", func(t *testing.T) {
		cmd := exec.Command(rategateBinary(t), "-check", "-config", filepath.Join(repoRoot, "nginx", "compose-rategate.yaml"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rategate -check: %v\n%s", err, out)
		}
	})
}

// buildPaths returns a service's build context (absolute) and Dockerfile
// (relative to the context), from `build: dir` or `build: {context, dockerfile}`.
func buildPaths(t *testing.T, service string, n *yaml.Node) (string, string) {
	var b struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	}
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
	} else if err := n.Decode(&b); err != nil {
		t.Fatalf("%s: build: %v", service, err)
	}
	if b.Context == "" {
		b.Context = "."
	}
	if b.Dockerfile == "" {
		b.Dockerfile = "Dockerfile"
	}
	return filepath.Join(repoRoot, b.Context), b.Dockerfile
}

// volumePaths returns a bind mount's host path (as written) and container
// path; src is "" for a named volume.
func volumePaths(n *yaml.Node) (src, dst string) {
	if n.Kind == yaml.ScalarNode {
		parts := strings.Split(n.Value, ":")
		if len(parts) < 2 {
			return "", ""
		}
		src, dst = parts[0], parts[1]
	} else {
		var v struct{ Type, Source, Target string }
		if n.Decode(&v) != nil || v.Type != "bind" {
			return "", ""
		}
		src, dst = v.Source, v.Target
	}
	if !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") {
		return "", dst
	}
	return src, dst
}

// wantCommandFiles checks that the files a command names inside a mounted
// directory exist on the host: rategate's -config, nginx's -p and -c.
func wantCommandFiles(t *testing.T, service string, args []string, mounts map[string]string) {
	t.Helper()
	hostOf := func(p string) (string, bool) {
		for dst, host := range mounts {
			if p == dst || strings.HasPrefix(p, dst+"/") {
				return filepath.Join(host, strings.TrimPrefix(p, dst)), true
			}
		}
		return "", false
	}
	prefix := ""
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-p":
			prefix = args[i+1]
		case "-config", "-c":
			p := args[i+1]
			if !filepath.IsAbs(p) {
				if prefix == "" {
					t.Errorf("%s: %s %s is relative and there is no -p before it", service, args[i], p)
					continue
				}
				p = filepath.Join(prefix, p)
			}
			host, ok := hostOf(p)
			if !ok {
				t.Errorf("%s: %s %s is not inside a mounted directory", service, args[i], p)
				continue
			}
			wantPath(t, service+" "+args[i]+" "+args[i+1], host, false)
		}
	}
}

// wantDockerfileSources checks that the local sources of the Dockerfile's
// COPY/ADD lines exist in the build context.
func wantDockerfileSources(t *testing.T, dockerfile, context string) {
	t.Helper()
	f, err := os.Open(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || (fields[0] != "COPY" && fields[0] != "ADD") {
			continue
		}
		srcs := fields[1 : len(fields)-1]
		if strings.HasPrefix(srcs[0], "--from=") {
			continue // from another stage or image
		}
		for _, s := range srcs {
			if strings.HasPrefix(s, "--") {
				continue
			}
			wantPath(t, "Dockerfile "+fields[0]+" "+s, filepath.Join(context, s), false)
		}
	}
}

func wantPath(t *testing.T, what, path string, dir bool) {
	t.Helper()
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		t.Errorf("%s: %v", what, err)
	case dir && !fi.IsDir():
		t.Errorf("%s: %s is not a directory", what, path)
	}
}

// TestComposeNginxConfig runs nginx/compose.conf with real nginx, the
// compose policy (nginx/compose-rategate.yaml) and the README's curl lines,
// with the service names pointed at loopback.
func TestComposeNginxConfig(t *testing.T) {
	needBinary(t, "curl", "curl")
	dir := filepath.Join(workDir, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	redis := testredis.Start(t)
	rg := newRategate(t, "rategate", dir, filepath.Join(repoRoot, "nginx", "compose-rategate.yaml"), "redis://"+redis.Addr+"/0")
	rg.start(t)
	a := startApp(t)
	prefix := filepath.Join(workDir, "compose-nginx")
	nx := startNginx(t, "compose", "compose.conf", rewrite{extra: map[string]string{
		"rategate:8080": rg.addr(),
		"app:80":        a.addr,
		"/tmp/":         prefix + "-temp-",
	}})
	needWindow(t, time.Minute, 10*time.Second)

	// docs/nginx.md: five requests a minute per user on /api/.
	var got []int
	for i := 0; i < 6; i++ {
		got = append(got, nx.do(t, userReq("/api/hello", "alice")).Status)
	}
	if fmt.Sprint(got) != "[200 200 200 200 200 429]" {
		t.Errorf("alice on /api/hello: %v, want [200 200 200 200 200 429]", got)
	}
	r := nx.do(t, userReq("/api/hello", "bob"))
	wantStatus(t, r, 200)
	wantHeader(t, r, "X-RateLimit-Remaining", "4")
	r = nx.do(t, userReq("/api/hello", "alice"))
	wantStatus(t, r, 429)
	wantHeader(t, r, "X-RateLimit-Rule", "api-per-user")
	if r.Header.Get("Retry-After") == "" {
		t.Errorf("no Retry-After: %v", r)
	}
	// Sending X-User-Id yourself changes nothing.
	wantStatus(t, nx.do(t, userReq("/api/hello", "alice", "X-User-Id: bob")), 429)

	// Three login attempts a minute per client IP.
	got = got[:0]
	for i := 0; i < 4; i++ {
		got = append(got, nx.do(t, request{Method: "POST", Path: "/login", From: "127.0.0.4"}).Status)
	}
	if fmt.Sprint(got) != "[200 200 200 429]" {
		t.Errorf("POST /login: %v, want [200 200 200 429]", got)
	}

	// rategate stopped: NGINX fails open.
	rg.stop()
	r = nx.do(t, userReq("/api/hello", "alice"))
	wantStatus(t, r, 200)
	wantNoHeader(t, r, "X-RateLimit-Limit")
}
