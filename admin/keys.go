package admin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
)

// KeyView is GET /v1/keys/{rule}: one identity's state under one rule.
type KeyView struct {
	Rule      string          `json:"rule"`
	Algorithm string          `json:"algorithm"`
	Key       string          `json:"key"`
	Limit     int64           `json:"limit"`
	Period    policy.Duration `json:"period"`
	Burst     int64           `json:"burst"`
	// Remaining is the quota left now (cost units), 0..burst.
	Remaining int64 `json:"remaining"`
	// ResetSeconds is the time until the quota is fully back, rounded up.
	ResetSeconds int64 `json:"reset_seconds"`
	ResetUS      int64 `json:"reset_us"`
	// Raw is the stored value as the store holds it (null when the store
	// cannot show it).
	Raw *limits.RawValue `json:"raw"`
	// RawError says why Raw is missing.
	RawError string `json:"raw_error,omitempty"`
	// Lease, for a rule with lease: true, is what this instance holds of
	// the key and what the store says is leased (every instance's slices).
	Lease *limits.LeaseState `json:"lease,omitempty"`
	// Reset is true on a DELETE answer.
	Reset bool `json:"reset,omitempty"`
	// IdentityOverride is the identity override or exception that applies
	// to the identity (null: none); Limit, Period and Burst are then the
	// identity's own.
	IdentityOverride *policy.IdentityView `json:"identity_override"`
}

// problemList is every problem with a query, one per parameter.
type problemList []string

func (p problemList) Error() string { return strings.Join(p, "; ") }

// headerMap implements limits.Headers for the identity given in the query.
type headerMap map[string][]byte

func (h headerMap) Peek(key string) []byte { return h[textproto.CanonicalMIMEHeaderKey(key)] }

// identityFromQuery builds the request whose key the rule would use, from
// ?ip=&user=&route=&method=&host=&header.<Name>=. Every dimension the rule
// is keyed on must be given; the error names the missing or bad parameter.
func identityFromQuery(r *limits.Rule, args *fasthttp.Args, ipv6Prefix int, pp limits.PathParams, anyNetwork bool) (*limits.Request, error) {
	req := &limits.Request{}
	hdrs := headerMap{}
	req.Headers = hdrs
	var problems []string
	// A parameter given twice names two identities: which one was meant is
	// unknown (a reset of ?ip=A&ip=B would unban A alone), so say so.
	seen := map[string]int{}
	for k := range args.All() {
		name := string(k)
		if h, ok := strings.CutPrefix(strings.ToLower(name), "header."); ok {
			name = "header." + textproto.CanonicalMIMEHeaderKey(h)
		}
		if seen[name]++; seen[name] == 2 {
			problems = append(problems, fmt.Sprintf("%s: given twice; give each dimension once", name))
		}
	}
	need := func(name string) ([]byte, bool) {
		if !args.Has(name) {
			problems = append(problems, fmt.Sprintf("%s: rule %q is keyed on %s; give ?%s=", name, r.Name, name, name))
			return nil, false
		}
		return append([]byte(nil), args.Peek(name)...), true
	}
	if args.Has("ip") {
		a, bits, err := parseClientIP(string(args.Peek("ip")), ipv6Prefix, anyNetwork)
		if err != nil {
			problems = append(problems, "ip: "+err.Error())
		} else {
			// The same ip dimension /auth uses: an IPv6 address is its
			// network (or the network given).
			req.IP = limits.AppendIPIdentity(nil, a, bits)
			req.Addr = a
		}
	}
	for _, p := range r.Key {
		switch p.Kind {
		case limits.KeyIP:
			if !args.Has("ip") {
				need("ip")
			}
		case limits.KeyUser:
			if args.Has("user") && len(args.Peek("user")) > 0 {
				req.User = append([]byte(nil), args.Peek("user")...)
				if msg := limits.HeaderValueProblem(string(req.User)); msg != "" {
					problems = append(problems, fmt.Sprintf("user: %q %s: no request is this user", req.User, msg))
				}
			} else if r.Anonymous == limits.AnonymousSkip {
				problems = append(problems, fmt.Sprintf("user: rule %q skips anonymous requests; give ?user=", r.Name))
			} else if !args.Has("ip") {
				problems = append(problems, fmt.Sprintf("user: rule %q is keyed on user; give ?user= (or ?ip= for an anonymous caller)", r.Name))
			}
		case limits.KeyRoute:
			if v, ok := need("route"); ok {
				if msg := config.RouteValueProblem(string(v), pp); msg != "" {
					problems = append(problems, fmt.Sprintf("route: %q %s", v, msg))
				}
				req.Route = pp.Normalize(nil, v)
			}
		case limits.KeyMethod:
			if v, ok := need("method"); ok {
				// "GET " or an empty value would be stored under an
				// identity /auth never makes (it reads a trimmed method,
				// and the request's own when the header is empty): an
				// override that never applies. HEAD is GET's.
				if msg := config.MethodValueProblem(string(v)); msg != "" {
					problems = append(problems, fmt.Sprintf("method: %q %s", v, msg))
				}
				req.Method = []byte(strings.ToUpper(string(v)))
			}
		case limits.KeyHost:
			if v, ok := need("host"); ok {
				req.Host = limits.AppendHost(nil, v)
				if msg := limits.HeaderValueProblem(string(v)); msg != "" {
					problems = append(problems, fmt.Sprintf("host: %q %s: no request has this host", v, msg))
				} else if msg := limits.HostProblem(strings.ToLower(string(v))); msg != "" {
					problems = append(problems, fmt.Sprintf("host: %q %s", v, msg))
				}
			}
		case limits.KeyHeader:
			param := "header." + p.Header
			v, ok := peekFold(args, param)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: rule %q is keyed on header %s; give ?%s= (empty for requests without it)", param, r.Name, p.Header, param))
				continue
			}
			if msg := limits.HeaderValueProblem(string(v)); msg != "" {
				problems = append(problems, fmt.Sprintf("%s: %q %s: no request sends this value", param, v, msg))
			}
			hdrs[p.Header] = v
		}
	}
	if len(problems) > 0 {
		return nil, problemList(problems)
	}
	return req, nil
}

// parseClientIP reads ?ip=: an address, or an IPv6 client's network as
// keys, logs and lists write it (2001:db8:1:2::/64, at identity.ipv6_prefix),
// and returns the network length its identity is made with. anyNetwork
// also takes a network of another length (48..128), for reading or
// removing what was stored under an earlier identity.ipv6_prefix.
func parseClientIP(v string, ipv6Prefix int, anyNetwork bool) (netip.Addr, int, error) {
	if ipv6Prefix <= 0 {
		ipv6Prefix = limits.DefaultIPv6Prefix
	}
	if a, err := netip.ParseAddr(v); err == nil {
		return a, ipv6Prefix, nil
	}
	p, err := netip.ParsePrefix(v)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("%q is not an IP address", v)
	}
	ok := p.Addr().Is6() && !p.Addr().Is4In6() && p.Masked() == p &&
		(p.Bits() == ipv6Prefix || anyNetwork && p.Bits() >= 48)
	if !ok {
		return netip.Addr{}, 0, fmt.Errorf("%q is a network: give one address, or an IPv6 client's network as keys write it (its /%d, identity.ipv6_prefix)", v, ipv6Prefix)
	}
	return p.Addr(), p.Bits(), nil
}

// peekFold finds a query parameter by case-insensitive name.
func peekFold(args *fasthttp.Args, name string) ([]byte, bool) {
	var v []byte
	found := false
	for k, val := range args.All() {
		if !found && strings.EqualFold(string(k), name) {
			v, found = append([]byte(nil), val...), true
		}
	}
	return v, found
}

func (s *Server) key(ctx *fasthttp.RequestCtx, method, name string) {
	r := s.ruleByName(name)
	if r == nil {
		writeError(ctx, fasthttp.StatusNotFound, "no such rule \""+name+"\"", nil)
		return
	}
	// A parameter that names no dimension of the rule (a misspelt ?usr=
	// beside ?ip=) would leave another identity named: refused, as the
	// identity endpoints refuse it.
	var unknown problemList
	for k := range ctx.QueryArgs().All() {
		if _, ok := dimensionParam(r, string(k)); !ok {
			unknown = append(unknown, notDimension(r, string(k)))
		}
	}
	req, err := identityFromQuery(r, ctx.QueryArgs(), int(s.ipv6Prefix.Load()), s.pathParams(), true)
	if err != nil || len(unknown) > 0 {
		var problems problemList
		if err != nil {
			problems = err.(problemList)
		}
		writeError(ctx, fasthttp.StatusBadRequest, "cannot build the key of rule \""+name+"\"", append(unknown, problems...))
		return
	}
	c, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	ov, ir := s.keyOverride(r, req)
	v := KeyView{Rule: r.Name, Algorithm: string(r.Algorithm), Limit: ir.Limit, Period: policy.Duration(ir.Period), Burst: ir.Burst,
		IdentityOverride: ov}
	if method == "DELETE" {
		// under the identity's own numbers: a leased reset writes what the
		// live slices hold in them (in the rule's, an identity with a higher
		// limit read it back as a full backlog: exhausted by its "unban")
		key, announceErr, err := s.limiter.ResetKey(c, ir, req)
		v.Key = key
		if announceErr != nil {
			s.log.Warn().Err(announceErr).Str("rule", r.Name).Str("key", key).
				Msg("cannot announce the key reset: other instances may keep denying this identity from their deny cache until its retry time")
		}
		switch {
		case errors.Is(err, limits.ErrNotApplicable):
			writeError(ctx, fasthttp.StatusBadRequest, "rule \""+name+"\" does not apply to this identity (anonymous: skip)", nil)
			return
		case err != nil:
			writeError(ctx, fasthttp.StatusServiceUnavailable, "reset "+key+": "+err.Error(), nil)
			return
		}
		s.log.Info().Str("rule", r.Name).Str("key", key).Msg("key reset through the admin API")
		v.Reset = true
	}
	st, err := s.limiter.Inspect(c, ir, req)
	switch {
	case errors.Is(err, limits.ErrNotApplicable):
		writeError(ctx, fasthttp.StatusBadRequest, "rule \""+name+"\" does not apply to this identity (anonymous: skip)", nil)
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusServiceUnavailable, "peek "+st.Key+": "+err.Error(), nil)
		return
	}
	v.Key = st.Key
	v.Remaining = min(max(st.Result.Remaining, 0), max(ir.Burst, ir.Limit))
	v.ResetUS = max(st.Result.ResetUS, 0)
	v.ResetSeconds = (v.ResetUS + 999_999) / 1_000_000
	v.Raw = st.Raw
	v.Lease = st.Lease
	if st.RawErr != nil {
		v.RawError = st.RawErr.Error()
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// atoiRange parses a whole number in [lo, hi].
func atoiRange(s string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("must be a whole number from %d to %d, got %q", lo, hi, s)
	}
	return n, nil
}
