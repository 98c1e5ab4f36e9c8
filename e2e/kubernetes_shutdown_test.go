//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// endpointRemovalBound is how long a terminating pod must keep answering
// /auth: the kubelet starts the termination (preStop, then SIGTERM) at the
// same time as the EndpointSlice controller marks the pod terminating, and
// kube-proxy on every node (and so ingress-nginx's auth-url, which connects
// to the Service's ClusterIP) keeps sending new connections to the pod until
// that change reaches it: about a second on a quiet cluster, several on a
// busy one. A connection refused meanwhile is a 500 for the client of
// examples/ingress-nginx.yaml (the ClusterIP is one address: NGINX has no
// other endpoint to retry), and a pass without a decision for
// ingress-nginx-429.yaml.
const endpointRemovalBound = 3 * time.Second

// rategate's own shutdown steps after SIGTERM: in-flight requests within
// app.shutdownGrace (20 s), then the leased slices' return within
// app.leaseReturnGrace (2 s).
const rategateShutdownBudget = 22 * time.Second

// k8sTermination is the part of deployment.yaml that decides how a pod ends.
type k8sTermination struct {
	Spec struct {
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					Lifecycle struct {
						PreStop *struct {
							Sleep *struct {
								Seconds int `yaml:"seconds"`
							} `yaml:"sleep"`
							Exec    any `yaml:"exec"`
							HTTPGet any `yaml:"httpGet"`
						} `yaml:"preStop"`
					} `yaml:"lifecycle"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestKubernetesTerminationKeepsServing plays the kubelet's part in a pod's
// end as deployment.yaml configures it (its preStop hook, then SIGTERM) and
// checks that /auth keeps answering while the endpoint removal travels
// (endpointRemovalBound), and that terminationGracePeriodSeconds leaves room
// for the hook and rategate's own shutdown steps.
func TestKubernetesTerminationKeepsServing(t *testing.T) {
	dir := filepath.Join(workDir, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var dep k8sTermination
	readYAML(t, filepath.Join(repoRoot, "deploy", "kubernetes", "deployment.yaml"), &dep)
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("deployment.yaml: %d containers, want 1", len(spec.Containers))
	}
	var preStop time.Duration
	if h := spec.Containers[0].Lifecycle.PreStop; h != nil {
		switch {
		case h.Sleep != nil:
			preStop = time.Duration(h.Sleep.Seconds) * time.Second
		default:
			// The image is scratch: an exec hook has no shell or sleep.
			t.Fatalf("deployment.yaml: preStop %+v: only a sleep action is played here", *h)
		}
	}
	grace := time.Duration(spec.TerminationGracePeriodSeconds) * time.Second
	if grace == 0 {
		grace = 30 * time.Second // the API's default
	}
	if preStop+rategateShutdownBudget > grace {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %v + rategate's shutdown %v: the kubelet kills it mid-shutdown",
			grace, preStop, rategateShutdownBudget)
	}

	redis := testredis.Start(t)
	policy := configMapPolicy(t, dir)
	env := []string{"RATEGATE_ADMIN_TOKEN=" + newToken(t), "RATEGATE_REDIS_URL=redis://" + redis.Addr + "/0"}
	logPath := filepath.Join(dir, "rategate.log")
	port, proc := startOnFreePort(t, "rategate", logPath, 10*time.Second, func(port int) *proc {
		admin := "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
		return startProcEnv(t, t, env, "rategate", logPath, rategateBinary(t),
			"-config", policy, "-listen", "127.0.0.1:"+strconv.Itoa(port), "-admin-listen", admin)
	}, func(port int) error {
		return httpStatus("http://127.0.0.1:"+strconv.Itoa(port)+"/readyz", http.StatusOK)
	})
	listen := "127.0.0.1:" + strconv.Itoa(port)

	// A new connection per request, as ingress-nginx's auth-url opens them.
	auth := func() error {
		req, _ := http.NewRequest("GET", "http://"+listen+"/auth", nil)
		req.Header.Set("X-Original-URI", "/api/x")
		req.Header.Set("X-Original-Method", "GET")
		req.Header.Set("X-Real-IP", "203.0.113.7")
		req.Close = true
		c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// Decided either way: the ConfigMap's api-per-ip rule admits 100
		// at once, then denies with its deny_status.
		if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := auth(); err != nil {
		t.Fatalf("/auth before the termination: %v", err)
	}

	// The kubelet: the preStop hook, then SIGTERM.
	start := time.Now()
	go func() {
		time.Sleep(preStop)
		proc.Signal(syscall.SIGTERM)
	}()
	var firstErr error
	var failedAt time.Duration
	for time.Since(start) < endpointRemovalBound {
		if err := auth(); err != nil {
			firstErr, failedAt = err, time.Since(start)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if firstErr != nil {
		t.Errorf("/auth failed %v after the pod's termination began (preStop %v, then SIGTERM): %v; "+
			"kube-proxy and ingress-nginx still send new connections to a terminating pod until the endpoint removal reaches them (want answers for %v)",
			failedAt.Round(time.Millisecond), preStop, firstErr, endpointRemovalBound)
	}
	// And it ends within the grace period, with exit 0.
	if err := waitFor(grace, func() error {
		if !proc.exited() {
			return fmt.Errorf("still running %v after the termination began", time.Since(start).Round(time.Second))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, proc.logTail())
	}
	if err := proc.Err(); err != nil {
		t.Errorf("exit: %v\n%s", err, proc.logTail())
	}
}
