package handler

import (
	"bufio"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"

	"github.com/rategate/rategate/limits"
	"github.com/valyala/fasthttp"
)

// keyRecorder decides with a real limiter and keeps the store keys of the
// last decision, rule name → key.
type keyRecorder struct {
	l    *limits.Limiter
	keys map[string]string
}

func (k *keyRecorder) Decide(ctx context.Context, req *limits.Request, d *limits.Decision) error {
	err := k.l.Decide(ctx, req, d)
	clear(k.keys)
	for _, v := range d.Verdicts {
		k.keys[v.Rule.Name] = v.Key
	}
	return err
}

// identityRig is a Handler over a limiter with one rule per identity
// dimension, limits too large to ever deny.
type identityRig struct {
	h   *Handler
	rec *keyRecorder
}

func newIdentityRig(t testing.TB) *identityRig {
	plan := rule("p", 1<<40, time.Second, limits.KeyHeader)
	plan.Key[0].Header = "X-Plan"
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	l := limits.NewLimiter(store, "rg", []*limits.Rule{
		rule("u", 1<<40, time.Second, limits.KeyUser),
		rule("i", 1<<40, time.Second, limits.KeyIP),
		rule("r", 1<<40, time.Second, limits.KeyRoute, limits.KeyMethod, limits.KeyHost),
		plan,
	})
	rec := &keyRecorder{l: l, keys: map[string]string{}}
	return &identityRig{
		h:   New(rec, l, Options{IPHeader: "X-Forwarded-For", TrustedProxies: nil}),
		rec: rec,
	}
}

// identityRequest is one /auth request's identity headers, sent byte for
// byte as a client (or a broken proxy) could.
type identityRequest struct{ uri, xff, user, method, host, plan string }

// served is what the handler made of an identityRequest.
type served struct {
	status int
	// user and uri are the header values as the handler saw them; rest
	// is every other identity header, joined.
	user, uri, rest string
	keys            map[string]string
}

// serve parses the request the way the server does and runs the handler.
// ok is false when fasthttp itself refuses the bytes (the server answers
// 400 then).
func (r *identityRig) serve(t *testing.T, in identityRequest) (out served, ok bool) {
	t.Helper()
	var b strings.Builder
	b.WriteString("GET /auth HTTP/1.1\r\nHost: x\r\n")
	for _, h := range [][2]string{
		{"X-Original-URI", in.uri}, {"X-Forwarded-For", in.xff}, {"X-User-Id", in.user},
		{"X-Original-Method", in.method}, {"X-Original-Host", in.host}, {"X-Plan", in.plan},
	} {
		b.WriteString(h[0] + ": " + h[1] + "\r\n")
	}
	b.WriteString("\r\n")
	var req fasthttp.Request
	if err := req.Read(bufio.NewReaderSize(strings.NewReader(b.String()), DefaultReadBufferSize)); err != nil {
		return served{}, false
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	r.h.Serve(&ctx)
	out = served{
		status: ctx.Response.StatusCode(),
		user:   string(ctx.Request.Header.Peek("X-User-Id")),
		uri:    string(ctx.Request.Header.Peek("X-Original-URI")),
		keys:   map[string]string{},
	}
	for _, name := range []string{"Host", "X-Original-URI", "X-Forwarded-For", "X-Original-Method", "X-Original-Host", "X-Plan"} {
		out.rest += name + "=" + string(ctx.Request.Header.Peek(name)) + "\n"
	}
	if out.status == fasthttp.StatusNoContent {
		for k, v := range r.rec.keys {
			out.keys[k] = v
		}
	}
	return out, true
}

// checkKey reports how key breaks the key invariants for rule name, or "".
func checkKey(name, key string) string {
	switch {
	case len(key) > limits.MaxKeyLen:
		return "longer than MaxKeyLen"
	case !strings.HasPrefix(key, "rg:{"+name+":"):
		return "does not start with the prefix and the rule's hash tag"
	case strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1:
		return "has more than one hash tag brace"
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c >= 0x7f {
			return "holds a byte that is not printable ASCII"
		}
	}
	return ""
}

// FuzzIdentityKey sends raw header values through the handler and checks
// the keys the limiter builds from them: no panic, no 5xx, every key
// bounded with one intact hash tag, different users never share a key
// (and equal ones always do), and a route keys the same as its normalized
// spelling.
func FuzzIdentityKey(f *testing.F) {
	f.Add("/login?x=1", "192.0.2.1", "alice", "bob", "POST", "api.example.com", "free")
	f.Add("/a/../admin", "10.0.0.1, 192.0.2.7", "=192.0.2.7", "", "GET", "H", "")
	f.Add("//x/./y", "::1", "a|b", "a%7Cb", "get", "h:80", "}{")
	for _, v := range hostile {
		f.Add("/"+v, "192.0.2.1, "+v, v, v+"x", v, v, v)
	}
	rig := newIdentityRig(f)
	f.Fuzz(func(t *testing.T, uri, xff, user1, user2, method, host, plan string) {
		in := identityRequest{uri: uri, xff: xff, user: user1, method: method, host: host, plan: plan}
		a, ok := rig.serve(t, in)
		if !ok {
			return
		}
		if a.status != 204 && a.status != 400 {
			t.Fatalf("%+v: status %d, want 204 or 400", in, a.status)
		}
		for name, key := range a.keys {
			if why := checkKey(name, key); why != "" {
				t.Fatalf("%+v: rule %s key %q %s", in, name, key, why)
			}
		}
		if a.status != 204 {
			return
		}

		// The same request with another user: keys differ exactly when the
		// user values (as the handler saw them) differ. A user value with a
		// line break can end the head early and so change the other
		// headers too; such pairs are not comparable.
		other := in
		other.user = user2
		if b, ok := rig.serve(t, other); ok && b.status == 204 && b.rest == a.rest {
			if (a.user == b.user) != (a.keys["u"] == b.keys["u"]) {
				t.Fatalf("users %q and %q have keys %q and %q", a.user, b.user, a.keys["u"], b.keys["u"])
			}
			for _, name := range []string{"i", "r", "p"} {
				if a.keys[name] != b.keys[name] {
					t.Fatalf("changing only the user changed rule %s's key: %q vs %q", name, a.keys[name], b.keys[name])
				}
			}
		}

		// The route spelled in its normal form keys the same.
		norm := in
		norm.uri = string(limits.NormalizeRoute(nil, []byte(a.uri)))
		if c, ok := rig.serve(t, norm); ok && c.status == 204 && c.uri == norm.uri && c.keys["r"] != a.keys["r"] {
			t.Fatalf("uri %q keys %q but its normal form %q keys %q", a.uri, a.keys["r"], norm.uri, c.keys["r"])
		}
	})
}
