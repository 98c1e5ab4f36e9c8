package admin

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

// maxIdentityBody bounds a PUT /v1/rules/{rule}/identities body (the
// listener reads no more; this holds for any other server too).
const maxIdentityBody = MaxBody

// maxIdentityPage bounds one page of GET /v1/rules/{rule}/identities: the
// page is built in memory, and 100,000 overrides of long identities made a
// 436 MB answer (and gigabytes of heap); `next` pages through the rest.
const maxIdentityPage = 10_000

// identities serves /v1/rules/{rule}/identities: GET lists the rule's
// identity overrides (or shows the one the query names), PUT sets one,
// DELETE removes one. The identity is the rule's key dimensions as query
// parameters, exactly as for /v1/keys/{rule}.
func (s *Server) identities(ctx *fasthttp.RequestCtx, method, name string) {
	r := s.ruleByName(name)
	if r == nil {
		writeError(ctx, fasthttp.StatusNotFound, "no such rule \""+name+"\"", nil)
		return
	}
	ids := s.rules.Identities()
	args := ctx.QueryArgs()
	if method == "GET" && !hasDimension(r, args) {
		s.listIdentities(ctx, ids, r, args)
		return
	}
	dims, err := identityParams(r, args)
	if err == nil {
		var req *limits.Request
		// Only a PUT must name a client under the prefix in force: an
		// override stored under another names no request.
		if req, err = identityFromQuery(r, args, int(s.ipv6Prefix.Load()), s.pathParams(), method != "PUT"); err == nil {
			s.identity(ctx, method, ids, r, dims, req)
			return
		}
	}
	writeError(ctx, fasthttp.StatusBadRequest, "cannot name an identity of rule \""+name+"\"", err.(problemList))
}

// identity serves one identity: GET, PUT or DELETE.
func (s *Server) identity(ctx *fasthttp.RequestCtx, method string, ids *policy.Identities, r *limits.Rule, dims map[string]string, req *limits.Request) {
	switch method {
	case "GET":
		v, ok := ids.Lookup(r.Name, req)
		if !ok {
			writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("rule %q has no identity override or exception for %s", r.Name, limits.JoinPairs(dims, ", ")), nil)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, v)
		return
	case "PUT":
		body := ctx.PostBody()
		if len(body) > maxIdentityBody {
			writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("body is %d bytes, more than the %d an identity override may have", len(body), maxIdentityBody), nil)
			return
		}
		c, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		v, err := ids.Set(c, r.Name, dims, req, body, s.caller(ctx))
		if err != nil {
			s.identityError(ctx, r.Name, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, v)
	case "DELETE":
		c, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		now, err := ids.Delete(c, r.Name, req)
		if err != nil {
			s.identityError(ctx, r.Name, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, struct {
			Deleted bool `json:"deleted"`
			// Now is what applies to the identity now: the config
			// file's exception, or null for the rule's own numbers.
			Now *policy.IdentityView `json:"now"`
		}{true, now})
	}
}

// identityError answers a failed set or delete.
func (s *Server) identityError(ctx *fasthttp.RequestCtx, rule string, err error) {
	var fe policy.FieldErrors
	var capErr *limits.IdentityCapError
	var se *policy.StoreError
	switch {
	case errors.Is(err, policy.ErrUnknownRule), errors.Is(err, policy.ErrNoIdentityOverride):
		writeError(ctx, fasthttp.StatusNotFound, err.Error(), nil)
	case errors.Is(err, limits.ErrNotApplicable):
		writeError(ctx, fasthttp.StatusBadRequest, "rule \""+rule+"\" does not apply to this identity (anonymous: skip)", nil)
	case errors.As(err, &fe):
		writeError(ctx, fasthttp.StatusBadRequest, "invalid identity override for rule \""+rule+"\"", fe)
	case errors.As(err, &capErr):
		writeError(ctx, fasthttp.StatusConflict, err.Error(), nil)
	case errors.As(err, &se):
		writeError(ctx, fasthttp.StatusServiceUnavailable, "identity override store unavailable: "+err.Error(), nil)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), nil)
	}
}

// listIdentities answers GET /v1/rules/{rule}/identities[?after=&n=].
func (s *Server) listIdentities(ctx *fasthttp.RequestCtx, ids *policy.Identities, r *limits.Rule, args *fasthttp.Args) {
	problems := plainParams(args, fmt.Sprintf("list with ?n= and ?after=, or name one identity with the rule's key [%s]",
		strings.Join(dimensionNames(r), ", ")), "n", "after")
	n := 1000
	if args.Has("n") {
		var err error
		if n, err = atoiRange(string(args.Peek("n")), 1, maxIdentityPage); err != nil {
			problems = append(problems, "n: "+err.Error())
		}
	}
	if len(problems) > 0 {
		writeError(ctx, fasthttp.StatusBadRequest, "cannot list the identity overrides of rule \""+r.Name+"\"", problems)
		return
	}
	l, err := ids.List(r.Name, string(args.Peek("after")), n)
	if err != nil {
		writeError(ctx, fasthttp.StatusNotFound, err.Error(), nil)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, l)
}

// notDimension is the problem of a query parameter key that names no
// dimension of r.
func notDimension(r *limits.Rule, key string) string {
	return fmt.Sprintf("%s: not a dimension of rule %q, which is keyed on [%s]", key, r.Name, strings.Join(dimensionNames(r), ", "))
}

// plainParams returns the problems of a query whose parameters are known
// (each given at most once): an unknown one (hint says what to give
// instead) or a repeated one. Peek would read the first of a repeated
// parameter and never an unknown one: either would answer another
// question than asked.
func plainParams(args *fasthttp.Args, hint string, known ...string) []string {
	var problems []string
	seen := map[string]bool{}
	for k := range args.All() {
		switch key := string(k); {
		case !slices.Contains(known, key):
			problems = append(problems, key+": unknown parameter; "+hint)
		case seen[key]:
			problems = append(problems, key+": given twice; give it once")
		default:
			seen[key] = true
		}
	}
	return problems
}

// dimensionNames returns the query parameters that name an identity of r.
func dimensionNames(r *limits.Rule) []string {
	names := make([]string, len(r.Key))
	for i, p := range r.Key {
		if p.Kind == limits.KeyHeader {
			names[i] = "header." + p.Header
		} else {
			names[i] = p.String()
		}
	}
	return names
}

// hasDimension reports whether the query names any identity dimension.
func hasDimension(r *limits.Rule, args *fasthttp.Args) bool {
	for k := range args.All() {
		if _, ok := dimensionParam(r, string(k)); ok {
			return true
		}
	}
	return false
}

// dimensionParam returns the canonical name of query parameter k when it
// names a dimension of r (ip is also the user of an anonymous caller).
func dimensionParam(r *limits.Rule, k string) (string, bool) {
	for _, p := range r.Key {
		switch {
		case p.Kind == limits.KeyHeader:
			if h, ok := strings.CutPrefix(strings.ToLower(k), "header."); ok && strings.EqualFold(h, p.Header) {
				return "header." + textproto.CanonicalMIMEHeaderKey(h), true
			}
		case k == p.String():
			return k, true
		case k == "ip" && p.Kind == limits.KeyUser && r.Anonymous == limits.AnonymousIP:
			return k, true
		}
	}
	return "", false
}

// identityParams checks that the query names only dimensions of r, each
// once (a second spelling of the same identity is refused, not ignored),
// and returns them as given.
func identityParams(r *limits.Rule, args *fasthttp.Args) (map[string]string, error) {
	dims := map[string]string{}
	var problems []string
	for k, v := range args.All() {
		key := string(k)
		name, ok := dimensionParam(r, key)
		if !ok {
			problems = append(problems, notDimension(r, key))
			continue
		}
		if _, dup := dims[name]; dup {
			problems = append(problems, fmt.Sprintf("%s: given twice; give each dimension once", name))
			continue
		}
		dims[name] = string(v)
	}
	if _, user := dims["user"]; user && !keyedOn(r, limits.KeyIP) {
		if _, ip := dims["ip"]; ip {
			problems = append(problems, fmt.Sprintf("ip: rule %q is not keyed on ip; ?ip= names an anonymous caller, so give ?user= or ?ip=, not both", r.Name))
		}
	}
	if len(problems) > 0 {
		return nil, problemList(problems)
	}
	return dims, nil
}

// keyedOn reports whether r's key has a part of kind k.
func keyedOn(r *limits.Rule, k limits.KeyKind) bool {
	for _, p := range r.Key {
		if p.Kind == k {
			return true
		}
	}
	return false
}

// caller names who makes an admin call, for the overrides it sets: the
// client's address.
func (s *Server) caller(ctx *fasthttp.RequestCtx) string {
	return ctx.RemoteAddr().String()
}

// markBlocked sets Blocked on the identities of v that an identity
// override or exception blocks now.
func (s *Server) markBlocked(v *top.TopView) {
	ids := s.rules.Identities()
	for i := range v.Rules {
		l := &v.Rules[i]
		for j := range l.Top {
			l.Top[j].Blocked = ids.Blocked(l.Rule, l.Top[j].Identity)
		}
	}
}

// keyOverride is the identity override part of GET /v1/keys/{rule}: what
// applies to the identity, and the rule it is decided by (r itself when
// nothing applies or the override is exempt or block, whose numbers are
// the rule's).
func (s *Server) keyOverride(r *limits.Rule, req *limits.Request) (*policy.IdentityView, *limits.Rule) {
	v, ok := s.rules.Identities().Lookup(r.Name, req)
	if !ok {
		return nil, r
	}
	eff := r
	if e, ok := s.limiter.Identity(r, req); ok && e.Rule.Identity == limits.IdentityLimit {
		eff = e.Rule
	}
	return &v, eff
}
