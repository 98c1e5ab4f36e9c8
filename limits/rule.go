// Package limits holds rategate's rules, their matching, key building, the
// rate-limit algorithms and the stores (Redis and in-memory) that run them.
// It knows nothing about HTTP.
package limits

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Algorithm names a rate-limit algorithm as written in the config file.
type Algorithm string

// The algorithms rategate implements. Their semantics are in docs/algorithms.md.
const (
	FixedWindow   Algorithm = "fixed_window"
	SlidingLog    Algorithm = "sliding_log"
	SlidingWindow Algorithm = "sliding_window"
	GCRA          Algorithm = "gcra"
	TokenBucket   Algorithm = "token_bucket"
)

// Algorithms lists every algorithm in the order the docs present them.
var Algorithms = []Algorithm{FixedWindow, SlidingLog, SlidingWindow, GCRA, TokenBucket}

// Valid reports whether a is an algorithm rategate implements.
func (a Algorithm) Valid() bool {
	for _, k := range Algorithms {
		if a == k {
			return true
		}
	}
	return false
}

// UsesBurst reports whether the algorithm has a burst separate from its limit.
func (a Algorithm) UsesBurst() bool { return a == GCRA || a == TokenBucket }

// Leasable reports whether a rule of the algorithm can be leased exactly
// (lease.go): every algorithm but sliding_log, whose admissions leave the
// log one period after their own time, so a unit spent later than it was
// counted would leave early.
func (a Algorithm) Leasable() bool { return a.Valid() && a != SlidingLog }

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
	// Host is compared case-insensitively; empty = any.
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
	Host   []byte
	IP     []byte
	// User is empty for anonymous requests.
	User    []byte
	Headers Headers
	// Cost, when > 0, overrides every matching rule's default cost.
	Cost int64
}

// Matches reports whether r's conditions hold for the request.
func (r *Rule) Matches(req *Request) bool {
	m := &r.Match
	if m.PathRegex != nil {
		if !m.PathRegex.Match(req.Route) {
			return false
		}
	} else if m.PathPrefix != "" && !bytes.HasPrefix(req.Route, []byte(m.PathPrefix)) {
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
	if m.Host != "" && !strings.EqualFold(string(req.Host), m.Host) {
		return false
	}
	for _, h := range m.Headers {
		if req.Headers == nil || !bytes.Equal(req.Headers.Peek(h.Name), h.Value) {
			return false
		}
	}
	return true
}
