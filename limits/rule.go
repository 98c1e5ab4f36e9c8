// Package limits is rategate's domain: rules, their matching, the
// algorithm table, key building, route normalization and the IP identity,
// and the Limiter that decides a request against a Store (with the breaker,
// the local fallback and the deny cache as its options). It knows neither
// HTTP nor Redis: the stores are limits/memstore and limits/redisstore, and
// limits/storetest is the conformance suite both pass.
package limits

import (
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/rategate/rategate/adaptive"
)

// KeyKind is one dimension of a rule's identity.
type KeyKind uint8

// The identity dimensions a rule can be keyed on.
const (
	KeyIP KeyKind = iota + 1
	KeyUser
	KeyRoute
	KeyMethod
	KeyHost
	KeyHeader
)

// KeyPart is one element of a rule's `key:` list.
type KeyPart struct {
	Kind KeyKind
	// Header is the canonical header name for KeyHeader, empty otherwise.
	Header string
}

// String returns the part as written in the config file ("ip", "header:X-Plan").
func (p KeyPart) String() string {
	switch p.Kind {
	case KeyIP:
		return "ip"
	case KeyUser:
		return "user"
	case KeyRoute:
		return "route"
	case KeyMethod:
		return "method"
	case KeyHost:
		return "host"
	case KeyHeader:
		return "header:" + p.Header
	}
	return "?"
}

// Match is a rule's compiled `match:` block. Every non-empty condition must
// hold; an empty Match matches every request.
type Match struct {
	// PathPrefix matches routes that start with it. Empty = any.
	PathPrefix string
	// PathRegex, when set, replaces PathPrefix ("~^/users/[0-9]+$" in YAML).
	PathRegex *regexp.Regexp
	// Methods are upper-case; empty = any.
	Methods []string
	// Host is the host as AppendHost writes it (config writes it so),
	// compared with the request's host, itself written so: a request the
	// rule matches is counted under the rule's host's one key. Empty = any.
	Host string
	// Headers are exact values; names are canonical.
	Headers []HeaderMatch
}

// String describes the conditions as -check and GET /v1/rules show them:
// "path prefix /login; methods POST", or "every request".
func (m *Match) String() string {
	var conds []string
	switch {
	case m.PathRegex != nil:
		conds = append(conds, "path ~"+m.PathRegex.String())
	case m.PathPrefix != "":
		conds = append(conds, "path prefix "+m.PathPrefix)
	}
	if len(m.Methods) > 0 {
		conds = append(conds, "methods "+strings.Join(m.Methods, ", "))
	}
	if m.Host != "" {
		conds = append(conds, "host "+m.Host)
	}
	for _, h := range m.Headers {
		conds = append(conds, fmt.Sprintf("header %s: %q", h.Name, h.Value))
	}
	if len(conds) == 0 {
		return "every request"
	}
	return strings.Join(conds, "; ")
}

// HeaderMatch requires a request header to have exactly Value.
type HeaderMatch struct {
	Name  string
	Value []byte
}

// Rule is one validated, compiled rule. Rules are immutable once built and
// shared by every request.
type Rule struct {
	Name      string
	Match     Match
	Key       []KeyPart
	Algorithm Algorithm
	// Limit is the number of requests (cost units) per Period.
	Limit  int64
	Period time.Duration
	// Burst is the bucket size for gcra and token_bucket; equal to Limit for
	// the window algorithms.
	Burst int64
	// Cost is the default weight of a matching request.
	Cost int64
	// Shadow rules are evaluated and reported but never deny.
	Shadow bool
	// Lease makes instances spend leased slices of the key's quota locally
	// instead of asking the store for every request, never over the limit
	// (lease.go). Not for sliding_log (config rejects it).
	Lease bool
	// Anonymous says what a `user` key does when the request carries no user.
	Anonymous Anonymous
	// Adaptive, when set, scales the limit by a factor that follows a load
	// signal (docs/adaptive.md). The limiter ignores it: package policy
	// applies the factor by handing the limiter a rule with new numbers.
	Adaptive *adaptive.Spec
	// Exceptions are the config file's per-identity exceptions (identities.go).
	Exceptions []Exception
	// Identity is set on a rule derived for one identity (an identity
	// override or exception): what it does to that identity. IdentityNone
	// on the rules of the file.
	Identity IdentityAction

	// identities is the per-identity table the limiter consults for this
	// rule (WithIdentities); nil when there is none.
	identities *IdentityTable
}

// Anonymous is the policy for the `user` dimension when no user is known.
type Anonymous uint8

// Anonymous policies.
const (
	// AnonymousIP keys an anonymous request's user dimension by client IP.
	AnonymousIP Anonymous = iota
	// AnonymousSkip skips rules keyed on user for anonymous requests.
	AnonymousSkip
)

// Headers gives read access to request headers by name. fasthttp's
// *RequestHeader satisfies it.
type Headers interface {
	Peek(key string) []byte
}

// Request is the identity of one client request, as extracted by the handler.
// Byte slices may alias the HTTP request and must not be kept after the call.
type Request struct {
	Method []byte
	Route  []byte
	// NginxRoute, when set, is the route as NGINX routes the request
	// (path parameters kept) where Route strips them
	// (identity.path_parameters: strip) and the two differ: a match.path
	// holds when it matches either, since NGINX may send the request to
	// the location the prefix guards ("/admin/..;/x" goes to /admin/ and
	// counts as /x).
	NginxRoute []byte
	Host       []byte
	IP         []byte
	// User is empty for anonymous requests.
	User    []byte
	Headers Headers
	// Cost, when > 0, overrides every matching rule's default cost.
	Cost int64
	// Addr is the client address IP was derived from, for the ip ranges of
	// a rule's exceptions; the zero Addr matches no range.
	Addr netip.Addr
	// RuleSet, when set (Limiter.RuleSet), is the rule set the request
	// was checked for and is decided by; zero: the rules in force.
	RuleSet RuleSet
}

// matchesPath reports whether route meets the path condition (any route
// when there is none).
func (m *Match) matchesPath(route []byte) bool {
	if m.PathRegex != nil {
		return m.PathRegex.Match(route)
	}
	return m.PathPrefix == "" || bytes.HasPrefix(route, []byte(m.PathPrefix))
}

// Matches reports whether r's conditions hold for the request.
func (r *Rule) Matches(req *Request) bool {
	m := &r.Match
	if !m.matchesPath(req.Route) && (req.NginxRoute == nil || !m.matchesPath(req.NginxRoute)) {
		return false
	}
	if len(m.Methods) > 0 {
		ok := false
		for _, meth := range m.Methods {
			if string(req.Method) == meth {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	// Not strings.EqualFold: it holds the Kelvin sign one letter with k
	// and the long s one with s, which AppendHost (and NGINX's $host)
	// keeps apart, so a rule would count hosts it matches under keys of
	// their own.
	if m.Host != "" && string(req.Host) != m.Host {
		return false
	}
	for _, h := range m.Headers {
		if req.Headers == nil || !bytes.Equal(TrimValue(req.Headers.Peek(h.Name)), h.Value) {
			return false
		}
	}
	return true
}
