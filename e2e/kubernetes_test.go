//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// k8sDeployment is the part of deploy/kubernetes/deployment.yaml the test runs.
type k8sDeployment struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Args []string `yaml:"args"`
					Env  []struct {
						Name      string `yaml:"name"`
						Value     string `yaml:"value"`
						ValueFrom struct {
							SecretKeyRef struct {
								Name string `yaml:"name"`
								Key  string `yaml:"key"`
							} `yaml:"secretKeyRef"`
						} `yaml:"valueFrom"`
					} `yaml:"env"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					StartupProbe   k8sProbe `yaml:"startupProbe"`
					LivenessProbe  k8sProbe `yaml:"livenessProbe"`
					ReadinessProbe k8sProbe `yaml:"readinessProbe"`
					VolumeMounts   []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
						SubPath   string `yaml:"subPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name      string `yaml:"name"`
					ConfigMap struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// configMapDir lays out a directory the way the kubelet mounts a ConfigMap:
// the file is a symlink to ..data/<file>, ..data a symlink to a timestamped
// directory, swapped atomically on update.
type configMapDir struct {
	root string
	n    int
}

func (c *configMapDir) write(t *testing.T, file, content string) {
	t.Helper()
	c.n++
	version := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", c.n, c.n)
	if err := os.MkdirAll(filepath.Join(c.root, version), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.root, version, file), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(c.root, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.root, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(c.root, file)
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", file), link); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKubernetesDeployment runs rategate the way deploy/kubernetes/ does:
// the Deployment's args and environment (Secret keys filled in), its
// ConfigMap laid out as the kubelet mounts one, and its probes. Addresses
// are moved to loopback ports; everything else is as shipped.
func TestKubernetesDeployment(t *testing.T) {
	dir := filepath.Join(workDir, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var dep k8sDeployment
	readYAML(t, filepath.Join(repoRoot, "deploy", "kubernetes", "deployment.yaml"), &dep)
	if n := len(dep.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("deployment.yaml: %d containers, want 1", n)
	}
	c := dep.Spec.Template.Spec.Containers[0]

	// The Service and Secret agree with the Deployment.
	var secret struct {
		Metadata   struct{ Name string }
		StringData map[string]string `yaml:"stringData"`
	}
	readYAML(t, filepath.Join(repoRoot, "deploy", "kubernetes", "examples", "secret.yaml"), &secret)
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	svc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "kubernetes", "service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`targetPort: (\S+)`).FindAllStringSubmatch(string(svc), -1) {
		if _, ok := ports[m[1]]; !ok {
			t.Errorf("service.yaml: targetPort %s is no container port of the Deployment (%v)", m[1], ports)
		}
	}

	redis := testredis.Start(t)
	token := newToken(t)
	secretValues := map[string]string{"admin-token": token, "redis-url": "redis://" + redis.Addr + "/0"}
	var env []string
	for _, e := range c.Env {
		if e.Value != "" {
			// a plain value (GOMEMLIMIT): the process gets it as it is
			env = append(env, e.Name+"="+e.Value)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref.Name != secret.Metadata.Name {
			t.Errorf("env %s reads Secret %q; examples/secret.yaml is %q", e.Name, ref.Name, secret.Metadata.Name)
		}
		if _, ok := secret.StringData[ref.Key]; !ok {
			t.Errorf("env %s reads key %q, which examples/secret.yaml lacks", e.Name, ref.Key)
		}
		v, ok := secretValues[ref.Key]
		if !ok {
			t.Fatalf("env %s: no test value for Secret key %q", e.Name, ref.Key)
		}
		env = append(env, e.Name+"="+v)
	}

	// The ConfigMap, mounted as a directory (a subPath would never update).
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].SubPath != "" {
		t.Fatalf("want one volume mount without subPath: %+v", c.VolumeMounts)
	}
	mountPath := c.VolumeMounts[0].MountPath
	cm := &configMapDir{root: filepath.Join(dir, "configmap")}
	policy, err := os.ReadFile(configMapPolicy(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	cm.write(t, "rategate.yaml", string(policy))

	// Args, with the mount path and the listeners moved to this run.
	listen, adminPort := testredis.FreePort(t), testredis.FreePort(t)
	hostPort := map[int]int{ports["http"]: listen, ports["admin"]: adminPort}
	args := append([]string(nil), c.Args...)
	watch := false
	for i := range args {
		switch {
		case args[i] == "-watch":
			watch = true
		case strings.HasPrefix(args[i], mountPath+"/"):
			args[i] = filepath.Join(cm.root, strings.TrimPrefix(args[i], mountPath+"/"))
		case i > 0 && (args[i-1] == "-listen" || args[i-1] == "-admin-listen"):
			_, p, _ := strings.Cut(args[i], ":")
			n, _ := strconv.Atoi(p)
			if _, ok := hostPort[n]; !ok {
				t.Fatalf("%s %s: port %d is not a container port (%v)", args[i-1], args[i], n, ports)
			}
			if args[i-1] == "-admin-listen" && !strings.HasPrefix(args[i], "0.0.0.0:") {
				t.Errorf("-admin-listen %s: Prometheus in another pod cannot reach it", args[i])
			}
			args[i] = "127.0.0.1:" + strconv.Itoa(hostPort[n])
		}
	}
	if !watch {
		t.Error("the Deployment does not run with -watch: ConfigMap updates would not reload")
	}
	proc := startProcEnv(t, t, env, "rategate", filepath.Join(dir, "rategate.log"), rategateBinary(t), args...)
	probeURL := func(p k8sProbe) string {
		return fmt.Sprintf("http://127.0.0.1:%d%s", hostPort[ports[p.HTTPGet.Port]], p.HTTPGet.Path)
	}
	for name, p := range map[string]k8sProbe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if err := waitServing(proc, 10*time.Second, func() error { return httpStatus(probeURL(p), http.StatusOK) }); err != nil {
			t.Fatalf("%s probe %s: %v\n%s", name, probeURL(p), err, proc.logTail())
		}
	}
	admin := "http://127.0.0.1:" + strconv.Itoa(adminPort)
	metric := func(t *testing.T, line string) func() error {
		return func() error {
			_, _, body := adminGet(t, admin, "/metrics", token)
			if !strings.Contains(body, "\n"+line+"\n") {
				return fmt.Errorf("no %q in /metrics", line)
			}
			return nil
		}
	}
	if err := waitFor(5*time.Second, metric(t, `rategate_rule_limit{rule="login-per-ip"} 10`)); err != nil {
		t.Fatal(err)
	}

	t.Run("rategate admin reaches it with the Secret's token", func(t *testing.T) {
		// docs/kubernetes.md: rategate admin -addr 127.0.0.1:9090 rules,
		// RATEGATE_ADMIN_TOKEN from the Secret (port-forward left out).
		cli := exec.Command(rategateBinary(t), "admin", "-addr", "127.0.0.1:"+strconv.Itoa(adminPort), "rules")
		cli.Env = append(os.Environ(), "RATEGATE_ADMIN_TOKEN="+token)
		out, err := cli.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "login-per-ip") {
			t.Errorf("rategate admin rules: %v\n%s", err, out)
		}
		cli = exec.Command(rategateBinary(t), "admin", "-addr", "127.0.0.1:"+strconv.Itoa(adminPort), "-token", "wrong", "rules")
		if out, err := cli.CombinedOutput(); err == nil {
			t.Errorf("rategate admin with a wrong token succeeded:\n%s", out)
		}
	})

	t.Run("a ConfigMap update reloads the rules", func(t *testing.T) {
		cm.write(t, "rategate.yaml", strings.Replace(string(policy), "limit: 10\n", "limit: 7\n", 1))
		if err := waitFor(10*time.Second, metric(t, `rategate_rule_limit{rule="login-per-ip"} 7`)); err != nil {
			t.Fatalf("%v\n%s", err, proc.logTail())
		}
		// An invalid update is refused; the rules in force stay.
		cm.write(t, "rategate.yaml", strings.Replace(string(policy), "limit: 10\n", "limit: 0\n", 1))
		if err := waitFor(10*time.Second, metric(t, `rategate_config_last_reload_successful 0`)); err != nil {
			t.Fatalf("%v\n%s", err, proc.logTail())
		}
		if err := metric(t, `rategate_rule_limit{rule="login-per-ip"} 7`)(); err != nil {
			t.Error(err)
		}
	})

	t.Run("Redis down: unready but still answering by failure_mode", func(t *testing.T) {
		redis.Stop()
		if err := waitFor(10*time.Second, func() error { return httpStatus(probeURL(c.ReadinessProbe), http.StatusServiceUnavailable) }); err != nil {
			t.Fatal(err)
		}
		if err := httpStatus(probeURL(c.LivenessProbe), http.StatusOK); err != nil {
			t.Errorf("liveness while Redis is down: %v (the pod would be restarted)", err)
		}
		if code := authRequest(t, "127.0.0.1:"+strconv.Itoa(listen), "POST", "/login", "203.0.113.7"); code != http.StatusNoContent {
			t.Errorf("/auth while Redis is down: %d, want 204 (failure_mode: allow)", code)
		}
	})
}

// TestIngressExamplesKeepAuthRequest: the ingress-nginx examples must not
// set auth-keepalive. With it the controller asks the auth service through
// a Lua handler that lets a request through only on a 200; rategate allows
// with 204, so every allowed request would be a 500 (and the 429 example's
// auth_request_set and fail-open error_page would never run).
func TestIngressExamplesKeepAuthRequest(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "kubernetes", "examples", "ingress-nginx*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("ingress-nginx examples: %v, %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if l := strings.TrimSpace(line); !strings.HasPrefix(l, "#") && strings.Contains(l, "auth-keepalive") {
				t.Errorf("%s:%d sets auth-keepalive: %s", filepath.Base(f), i+1, l)
			}
		}
	}
}
