//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTrustedProxyWrittenIPv4MappedIsTrusted: identity.ip_header:
// X-Forwarded-For behind a load balancer, with rategate-proxy.conf sending
// $proxy_add_x_forwarded_for (what rategate's own 400 tells the operator
// to set) and the balancer named in trusted_proxies as an IPv4-mapped
// address, the form NGINX logs a peer in on a dual-stack `listen [::]:80`.
// docs/decision-endpoint.md ("Client identity") says an IPv4-mapped
// address is the IPv4 address, and a rule's exceptions read
// "::ffff:198.51.100.66" as 198.51.100.66; trusted_proxies keep it an IPv6
// prefix, while the walk unmaps every hop before it asks: the balancer is
// never trusted, every client is the balancer, and all of them share one
// per-IP quota. One client's requests deny every other client.
//
// The balancer (a Go stand-in on 127.0.0.1) appends each client's public
// address; three clients send 2 requests each under a per-IP limit of 2:
// all 6 must pass.
func TestTrustedProxyWrittenIPv4MappedIsTrusted(t *testing.T) {
	m := startMini(t)
	for i, tp := range []string{`"::ffff:127.0.0.1"`, `"::ffff:127.0.0.0/104"`} {
		t.Run(tp, func(t *testing.T) {
			id := "  ip_header: X-Forwarded-For\n  trusted_proxies: [" + tp + "]\n"
			rg := m.rategate(t, fmt.Sprintf("rategate-%d", i), policy(429, fmt.Sprintf("mapped%d", i), id, lbRule))
			nx := startNginx(t, fmt.Sprintf("xff-%d", i), "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr,
				extra: map[string]string{"proxy_set_header X-Forwarded-For   $remote_addr;": "proxy_set_header X-Forwarded-For   $proxy_add_x_forwarded_for;"}})
			needWindow(t, window, 30*time.Second)
			lb := startLoadBalancer(t, nx.base(), map[string]string{})
			var got []string
			passed := 0
			for c := 1; c <= 3; c++ {
				from := fmt.Sprintf("127.0.%d.%d", 110+i, c)
				lb.public[from] = fmt.Sprintf("198.51.100.%d", 10*i+c)
				for range lbLimit {
					st := lb.send(t, from, "/api/x", nil)
					got = append(got, fmt.Sprintf("%s:%d", lb.public[from], st))
					if st == 200 {
						passed++
					}
				}
			}
			if passed != 3*lbLimit {
				t.Errorf("trusted_proxies: [%s]: %d of %d requests passed (%s), want all: three clients, each within its per-IP limit of %d;"+
					" the balancer 127.0.0.1 was not trusted as %s, so every client counted as the balancer and shared one quota",
					tp, passed, 3*lbLimit, strings.Join(got, " "), lbLimit, tp)
			}
		})
	}
}

const lbLimit = 2

// lbRule: a per-IP limit of lbLimit a day on /api/.
var lbRule = fmt.Sprintf(`    - name: per-ip
      match: {path: /api/}
      key: [ip]
      algorithm: fixed_window
      limit: %d
      period: 24h
`, lbLimit)

// loadBalancer is a stand-in for the load balancer or CDN in front of
// NGINX (docs/nginx.md, "Identity: what rategate sees"): it forwards every
// request to NGINX from 127.0.0.1 and appends the client's address to
// X-Forwarded-For, as such balancers do ("<what the client sent>, <client>").
// The client's address is the public one its loopback source stands for
// (public), so that clients are outside the ranges NGINX and rategate trust.
type loadBalancer struct {
	addr   string
	public map[string]string // loopback source address -> the client's address as the balancer writes it
}

func startLoadBalancer(t *testing.T, target string, public map[string]string) *loadBalancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &loadBalancer{addr: ln.Addr().String(), public: public}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			host, _, _ := net.SplitHostPort(pr.In.RemoteAddr)
			client, ok := lb.public[host]
			if !ok {
				client = host
			}
			// Every line the client sent, in order, then the client: one line.
			prior := strings.Join(pr.In.Header["X-Forwarded-For"], ", ")
			if prior != "" {
				prior += ", "
			}
			pr.Out.Header["X-Forwarded-For"] = []string{prior + client}
		},
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return lb
}

// send writes one raw request for path from the loopback address from,
// with header lines hdrs (each "Name: value", may hold CRLFs), and returns
// the status.
func (lb *loadBalancer) send(t *testing.T, from, path string, hdrs []string) int {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", lb.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	b.WriteString("GET " + path + " HTTP/1.1\r\nHost: gw.example\r\n")
	for _, h := range hdrs {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("from %s %q: %v", from, hdrs, err)
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("status line %q", line)
	}
	st, _ := strconv.Atoi(f[1])
	return st
}
