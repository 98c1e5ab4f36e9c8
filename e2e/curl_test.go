//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// request is one client request, made with the curl binary.
type request struct {
	Method string
	Path   string // with the query, sent as is (curl --path-as-is)
	// Target, when set, is the request target sent instead of Path
	// (curl --request-target), e.g. an absolute-form "http://h/p".
	Target string
	Header []string // "Name: value"
	// From is the client's source address (curl --interface), any of
	// 127.0.0.0/8; "" = 127.0.0.1.
	From    string
	Body    []byte
	Chunked bool // send Body with Transfer-Encoding: chunked
}

// response is what the client saw.
type response struct {
	Status  int
	Header  http.Header
	Body    string
	Elapsed time.Duration
}

// decided reports whether rategate decided the request: its rate-limit
// headers reached the client.
func (r response) decided() bool { return r.Header.Get("X-RateLimit-Limit") != "" }

func (r response) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d in %v", r.Status, r.Elapsed.Round(time.Millisecond))
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining",
		"X-RateLimit-Reset", "Retry-After", "X-RateLimit-Rule", "X-RateLimit-Status", "Content-Type"} {
		if v := r.Header.Values(k); len(v) > 0 {
			fmt.Fprintf(&b, "\n  %s: %s", k, strings.Join(v, " | "))
		}
	}
	body := r.Body
	if len(body) > 300 {
		body = body[:300] + "..."
	}
	fmt.Fprintf(&b, "\n  body: %q", body)
	return b.String()
}

var bodySeq atomic.Int64

// curl runs one request against base ("http://127.0.0.1:PORT").
func curl(base string, req request) (response, error) {
	bin, err := exec.LookPath("curl")
	if err != nil {
		return response{}, fmt.Errorf("curl not found in PATH: %s", installHint("curl"))
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	args := []string{"-sS", "--http1.1", "--max-time", "10", "--path-as-is", "-X", method,
		"-o", "-", "-w", "%{stderr}%{json}\n%{header_json}\n"}
	if req.From != "" {
		args = append(args, "--interface", req.From)
	}
	if req.Target != "" {
		args = append(args, "--request-target", req.Target)
	}
	for _, h := range req.Header {
		args = append(args, "-H", h)
	}
	if req.Body != nil {
		f := filepath.Join(workDir, fmt.Sprintf("body-%d", bodySeq.Add(1)))
		if err := os.WriteFile(f, req.Body, 0o644); err != nil {
			return response{}, err
		}
		defer os.Remove(f)
		args = append(args, "--data-binary", "@"+f, "-H", "Expect:", "-H", "Content-Type: application/octet-stream")
		if req.Chunked {
			args = append(args, "-H", "Transfer-Encoding: chunked")
		}
	}
	args = append(args, base+req.Path)

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return response{}, fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	var info struct {
		Code      int     `json:"http_code"`
		TimeTotal float64 `json:"time_total"`
	}
	var hdr map[string][]string
	dec := json.NewDecoder(&stderr)
	if err := dec.Decode(&info); err != nil {
		return response{}, fmt.Errorf("curl %s: write-out: %v", req.Path, err)
	}
	if err := dec.Decode(&hdr); err != nil {
		return response{}, fmt.Errorf("curl %s: header_json: %v", req.Path, err)
	}
	r := response{
		Status:  info.Code,
		Header:  http.Header{},
		Body:    stdout.String(),
		Elapsed: time.Duration(info.TimeTotal * float64(time.Second)),
	}
	for k, vs := range hdr {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r, nil
}

// do runs one request against n and fails the test if curl fails.
func (n *nginxServer) do(t testing.TB, req request) response {
	t.Helper()
	r, err := curl(n.base(), req)
	if err != nil {
		t.Fatalf("nginx %s: %v", n.name, err)
	}
	return r
}

func (n *nginxServer) base() string { return fmt.Sprintf("http://127.0.0.1:%d", n.port) }

// doMany runs reqs against n, parallel at a time, and returns the
// responses in the order of reqs.
func (n *nginxServer) doMany(t testing.TB, reqs []request, parallel int) []response {
	t.Helper()
	out := make([]response, len(reqs))
	errs := make([]error, len(reqs))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = curl(n.base(), reqs[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("nginx %s: %v", n.name, err)
		}
	}
	return out
}

// repeat is n copies of req.
func repeat(req request, n int) []request {
	out := make([]request, n)
	for i := range out {
		out[i] = req
	}
	return out
}

// userReq is a GET of path as user (the demo identity header X-User).
func userReq(path, user string, extra ...string) request {
	return request{Path: path, Header: append([]string{"X-User: " + user}, extra...)}
}
