package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rategate/rategate/limits"
)

// A rule's `exceptions:` are the identities it treats differently for
// good: each names one identity by the rule's key dimensions (or, for the
// ip dimension, a range of addresses) and gives it numbers of its own, or
// exempts it, or blocks it:
//
//	rules:
//	  - name: api-per-user
//	    key: [user]
//	    ...
//	    exceptions:
//	      - match: {user: acme}
//	        limit: 1000
//	        reason: enterprise plan
//	      - match: {user: healthcheck}
//	        exempt: true
//	  - name: per-ip
//	    key: [ip]
//	    ...
//	    exceptions:
//	      - match: {ip: 10.0.0.0/8}
//	        exempt: true
//
// What changes at run time belongs to the admin API's identity overrides,
// which win over an exception for the same identity.

// Bounds of identity overrides and exceptions.
const (
	defaultMaxIdentities = 100_000
	maxMaxIdentities     = 1_000_000
	maxExceptionFactor   = 1000.0
	maxExceptionReason   = 200
)

// IdentityOverrides is `identity_overrides:`.
type IdentityOverrides struct {
	// MaxEntries caps the runtime identity overrides stored, all rules
	// together; default 100000.
	MaxEntries int
}

type rawIdentityOverrides struct {
	section
	MaxEntries opt[int64]
}

func (o *rawIdentityOverrides) fields() []field {
	return []field{{"max_entries", &o.MaxEntries}}
}

// rawException is one entry of a rule's `exceptions:`.
type rawException struct {
	section
	Match  []headerValue // dimension → value, in file order
	Limit  opt[int64]
	Period opt[time.Duration]
	Burst  opt[int64]
	Factor opt[string] // a number; read as text so 1.5 stays the decimal 1.5
	Exempt opt[bool]
	Block  opt[bool]
	Reason opt[string]
	// unknown is set when the exception has a key it does not know: a
	// misspelt action, already reported.
	unknown bool
}

func (e *rawException) fields() []field {
	return []field{
		{"match", nil}, // read by exceptions: its values are not one type
		{"limit", &e.Limit},
		{"period", &e.Period},
		{"burst", &e.Burst},
		{"factor", &e.Factor},
		{"exempt", &e.Exempt},
		{"block", &e.Block},
		{"reason", &e.Reason},
	}
}

// exceptions reads a rule's exception list.
func (d *decoder) exceptions(n *yaml.Node, w where, key string, p *opt[[]rawException]) {
	p.Set, p.Line = true, n.Line
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Bad = true
		d.fieldErr(w, key, n.Line, "must be a list of exceptions (each \"- match: {user: acme}\" and limit:, exempt: true or block: true), got %s", got(n))
		return
	}
	p.V = make([]rawException, len(n.Content))
	for i, item := range n.Content {
		e := &p.V[i]
		item = resolve(item)
		e.Set, e.Line = true, item.Line
		at := where{label: w.label, rule: true, sub: fmt.Sprintf("%s%s[%d].", w.sub, key, i)}
		if item.Kind != yaml.MappingNode {
			e.Bad = true
			d.fieldErr(w, fmt.Sprintf("%s[%d]", key, i), item.Line, "must be a mapping (match:, then limit:, period:, burst:, factor:, exempt: or block:, reason:), got %s", got(item))
			continue
		}
		fs := e.fields()
		for _, kv := range d.pairs(item, at) {
			k := kv.key.Value
			if k == "match" {
				e.Match = d.exceptionMatch(kv.val, at, e)
				continue
			}
			var dst any
			for _, f := range fs {
				if f.key == k && f.dst != nil {
					dst = f.dst
				}
			}
			if dst == nil {
				d.unknownIn(at, kv.key, fs)
				e.unknown = true
				continue
			}
			d.value(kv.val, at, k, dst)
		}
	}
}

// unknownIn reports an unknown key of a mapping nested in a rule.
func (d *decoder) unknownIn(w where, k *yaml.Node, fs []field) {
	hint, best := "", 3
	for _, f := range fs {
		if dist := editDistance(k.Value, f.key); dist < best {
			hint, best = fmt.Sprintf(" (did you mean %q?)", f.key), dist
		}
	}
	d.add(k.Line, w.label, "line %d: unknown key %q in %s%s", k.Line, k.Value, strings.TrimSuffix(w.sub, "."), hint)
}

// exceptionMatch reads `match:` of an exception: dimension → scalar.
func (d *decoder) exceptionMatch(n *yaml.Node, w where, e *rawException) []headerValue {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		e.Bad = true
		d.fieldErr(w, "match", n.Line, "must be a mapping of key dimensions to values such as {user: acme} or {ip: 10.0.0.0/8}, got %s", got(n))
		return nil
	}
	var out []headerValue
	for _, kv := range d.pairs(n, w) {
		v := resolve(kv.val)
		s, ok := scalarString(v)
		if !ok {
			e.Bad = true
			d.fieldErr(w, "match "+strconv.Quote(kv.key.Value), v.Line, "must be a string, got %s", got(v))
			continue
		}
		out = append(out, headerValue{Name: kv.key.Value, Value: s, Line: kv.key.Line})
	}
	if len(out) == 0 {
		e.Bad = true
		d.fieldErr(w, "match", n.Line, "names no identity: give every dimension of the rule's key, such as {user: acme}")
	}
	return out
}

// dimensionName returns the admin API's name of a key part: ip, user,
// route, method, host, header.<Name>.
func dimensionName(p limits.KeyPart) string {
	if p.Kind == limits.KeyHeader {
		return "header." + p.Header
	}
	return p.String()
}

// compileExceptions validates rr's exceptions against the compiled rule r
// and sets r.Exceptions. The numbers are checked as a runtime override's
// are, only when the rule itself is valid (its own problems say enough).
func compileExceptions(d *decoder, rr *rawRule, r *limits.Rule, id Identity) {
	if rr.Exceptions.ok() && rr.Exceptions.V == nil {
		// What a file cut midway (a rewrite in place read by -watch) looks
		// like: taken as none, every block and lower limit would go.
		d.add(rr.Exceptions.Line, rr.label, "exceptions: has nothing under it; write \"exceptions: []\" for none")
		return
	}
	if !rr.Exceptions.ok() || len(rr.Exceptions.V) == 0 {
		return
	}
	ruleOK := CheckRule(r) == nil
	if len(r.Key) == 0 && !rr.Key.Bad {
		d.add(rr.Exceptions.Line, rr.label, "exceptions need a rule keyed on something: key [] is one counter for every request")
		return
	}
	seen := map[string]int{}
	var ranges []earlierRange
	for i := range rr.Exceptions.V {
		raw := &rr.Exceptions.V[i]
		if raw.Bad {
			continue
		}
		at := func(format string, args ...any) {
			d.add(raw.Line, rr.label, "exceptions[%d]: %s", i, fmt.Sprintf(format, args...))
		}
		ex, ok := compileExceptionMatch(raw, r, id, at)
		if !ok {
			continue
		}
		ident := ex.ID
		if ident == "" {
			ident = "range " + ex.Range.String() + "|" + strings.Join(ex.Parts, "|")
		}
		if j, dup := seen[ident]; dup {
			at("names the same identity as exceptions[%d]", j)
			continue
		}
		seen[ident] = i
		if j := coveringRange(ranges, &ex); j >= 0 {
			// Ranges apply in file order, the first that holds an
			// address wins: this one would never apply.
			at("%s lies inside exceptions[%d]'s %s, which comes first and so always applies instead; put the narrower range first",
				ex.Range, ranges[j].at, ranges[j].ex.Range)
			continue
		}
		if !compileAction(raw, &ex, r, ruleOK, at) {
			continue
		}
		r.Exceptions = append(r.Exceptions, ex)
		if ex.ID == "" {
			ranges = append(ranges, earlierRange{i, ex})
		}
	}
}

// earlierRange is a range exception accepted before: at is its index in
// the rule's exceptions.
type earlierRange struct {
	at int
	ex limits.Exception
}

// coveringRange returns the index in earlier of a range exception that
// holds every identity range exception ex holds (a wider or equal range,
// the same values of the rule's other key parts), or -1.
func coveringRange(earlier []earlierRange, ex *limits.Exception) int {
	for j := range earlier {
		w := &earlier[j].ex
		if w.Range.Addr().Is4() != ex.Range.Addr().Is4() || w.Range.Bits() > ex.Range.Bits() || !w.Range.Contains(ex.Range.Addr()) {
			continue
		}
		same := len(w.Parts) == len(ex.Parts)
		for k := 0; same && k < len(w.Parts); k++ {
			same = k == w.IP || w.Parts[k] == ex.Parts[k]
		}
		if same {
			return j
		}
	}
	return -1
}

// compileExceptionMatch turns an exception's match into its identity (or range).
func compileExceptionMatch(raw *rawException, r *limits.Rule, id Identity, at func(string, ...any)) (limits.Exception, bool) {
	ex := limits.Exception{Match: map[string]string{}}
	given := map[string]string{}
	names := make([]string, len(r.Key))
	for j, p := range r.Key {
		names[j] = keyName(p)
	}
	ok := true
	for _, m := range raw.Match {
		name := m.Name
		if h, isHeader := strings.CutPrefix(name, "header:"); isHeader && validToken(h) {
			name = "header:" + textproto.CanonicalMIMEHeaderKey(h)
		}
		found := false
		for _, n := range names {
			found = found || n == name
		}
		if !found {
			at("match %q is not a dimension of the rule's key [%s]", m.Name, strings.Join(names, ", "))
			ok = false
			continue
		}
		given[name] = m.Value
	}
	var missing []string
	for _, n := range names {
		if _, has := given[n]; !has {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		at("match must give every dimension of the rule's key; missing %s", strings.Join(missing, ", "))
		ok = false
	}
	if !ok {
		return ex, false
	}
	req := limits.Request{Headers: headerValues{}}
	isRange := false
	for j, p := range r.Key {
		v := given[names[j]]
		ex.Match[dimensionName(p)] = v
		switch p.Kind {
		case limits.KeyIP:
			pfx, good := parsePrefix(v)
			if !good {
				at("match ip %q is not an IP address or a CIDR range", v)
				return ex, false
			}
			bits := pfx.Addr().BitLen()
			if pfx.Addr().Is6() {
				bits = min(id.IPv6Prefix, 128)
				if pfx.Bits() > bits {
					// A narrower range than one client would split a key.
					if pfx.Bits() < 128 {
						at("match ip %q is narrower than one IPv6 client: rategate counts each IPv6 client as its /%d (identity.ipv6_prefix); use a /%d or wider range", v, bits, bits)
						return ex, false
					}
					pfx = netip.PrefixFrom(pfx.Addr(), bits).Masked()
				}
			}
			if pfx.Bits() >= bits {
				req.IP = limits.AppendIPIdentity(nil, pfx.Addr(), id.IPv6Prefix)
				continue
			}
			isRange = true
			ex.Range, ex.IP = pfx, j
		case limits.KeyUser:
			if v == "" {
				at("match user is empty; an anonymous caller is its ip (give the ip to a rule keyed on ip)")
				return ex, false
			}
			if msg := limits.HeaderValueProblem(v); msg != "" {
				at("match user %q %s: no request is this user", v, msg)
				return ex, false
			}
			req.User = []byte(v)
		case limits.KeyRoute:
			if !strings.HasPrefix(v, "/") {
				at("match route %q must start with \"/\"", v)
				return ex, false
			}
			if msg := RouteValueProblem(v, id.PathParams); msg != "" {
				at("match route %q %s", v, msg)
				return ex, false
			}
			req.Route = id.PathParams.Normalize(nil, []byte(v))
		case limits.KeyMethod:
			if msg := MethodValueProblem(v); msg != "" {
				at("match method %q %s", v, msg)
				return ex, false
			}
			req.Method = []byte(strings.ToUpper(v))
		case limits.KeyHost, limits.KeyHeader:
			if msg := limits.HeaderValueProblem(v); msg != "" {
				at("match %s %q %s: no request sends this value", dimensionName(p), v, msg)
				return ex, false
			}
			if p.Kind == limits.KeyHost {
				if msg := limits.HostProblem(strings.ToLower(v)); msg != "" {
					at("match host %q %s", v, msg)
					return ex, false
				}
				req.Host = limits.AppendHost(nil, []byte(v))
			} else {
				req.Headers.(headerValues)[p.Header] = []byte(v)
			}
		}
	}
	if !isRange {
		ident, _ := limits.KeyIdentity(r, &req)
		ex.ID = ident
		return ex, true
	}
	if len(r.Key) > 1 {
		ident, _ := limits.AppendIdentity(nil, r, &req)
		ex.Parts = strings.Split(string(ident), "|")
	}
	return ex, true
}

// RouteValueProblem says why a route given to an exception or an identity
// override would name more requests than it says ("" when it would not):
// a query or fragment, which no route /auth counts holds. Read silently,
// it would fall away and the entry cover the whole route
// ("/status?probe=lb" exempting every request of /status). (Path
// parameters under identity.path_parameters: strip are stripped, as /auth
// strips them: documented, and what a route copied from a log means.)
func RouteValueProblem(v string, pp limits.PathParams) string {
	if strings.ContainsAny(v, "?#") {
		n := pp.Normalize(nil, []byte(v))
		return fmt.Sprintf("holds a query or fragment, which no route /auth counts has (it would name every request of %q); write %q (a literal ? or # in the path is %%3F or %%23)", n, n)
	}
	return ""
}

// MethodValueProblem says why a method given to an exception or an
// identity override names no method of its own ("" when it does): not a
// method at all, or HEAD, which method keys count as GET (one quota for a
// page and its HEAD): read silently, an entry for HEAD would apply to
// every GET.
func MethodValueProblem(v string) string {
	switch {
	case !validToken(v):
		return "is not an HTTP method"
	case strings.EqualFold(v, "HEAD"):
		return "is counted as GET (a HEAD is a GET without its body: one quota for both); write GET, which covers HEAD too"
	}
	return ""
}

// keyName is a key part as the config file writes it in `key:`.
func keyName(p limits.KeyPart) string { return p.String() }

// headerValues implements limits.Headers for an exception's header values.
type headerValues map[string][]byte

func (h headerValues) Peek(key string) []byte { return h[textproto.CanonicalMIMEHeaderKey(key)] }

// compileAction reads what an exception does and checks its numbers.
func compileAction(raw *rawException, ex *limits.Exception, r *limits.Rule, ruleOK bool, at func(string, ...any)) bool {
	ok := true
	var numbers []string
	if v := &raw.Limit; v.ok() {
		numbers = append(numbers, "limit")
		ex.Limit = v.V
		if msg := between(v.V, 1, maxLimit); msg != "" {
			at("limit %s", msg)
			ok = false
		}
	}
	if v := &raw.Period; v.ok() {
		numbers = append(numbers, "period")
		ex.Period = v.V
		if msg := checkPeriod(v.V); msg != "" {
			at("%s", msg)
			ok = false
		}
	}
	if v := &raw.Burst; v.ok() {
		numbers = append(numbers, "burst")
		ex.Burst = v.V
		if msg := between(v.V, 1, maxLimit); msg != "" {
			at("burst %s", msg)
			ok = false
		}
	}
	if v := &raw.Factor; v.ok() {
		numbers = append(numbers, "factor")
		f, err := strconv.ParseFloat(v.V, 64)
		switch {
		case err != nil:
			at("factor must be a number such as 1.5, got %q", v.V)
			ok = false
		case !(f > 0) || f > maxExceptionFactor || math.IsInf(f, 0):
			at("factor must be > 0 and <= %g, got %s", maxExceptionFactor, v.V)
			ok = false
		default:
			ex.Factor = f
		}
	}
	for _, v := range []*opt[int64]{&raw.Limit, &raw.Burst} {
		if v.Bad {
			ok = false
		}
	}
	if raw.Period.Bad || raw.Factor.Bad || raw.Exempt.Bad || raw.Block.Bad || raw.Reason.Bad {
		ok = false
	}
	exempt, block := raw.Exempt.ok() && raw.Exempt.V, raw.Block.ok() && raw.Block.V
	switch {
	case exempt && block:
		at("exempt and block: give one of them, not both")
		return false
	case (exempt || block) && len(numbers) > 0:
		what := map[bool]string{true: "exempt", false: "block"}[exempt]
		at("%s cannot go with %s: give numbers, or exempt: true, or block: true", strings.Join(numbers, ", "), what)
		return false
	case exempt:
		ex.Action = limits.IdentityExempt
	case block:
		ex.Action = limits.IdentityBlock
	case len(numbers) == 0:
		if ok && !raw.unknown {
			at("says nothing to do: give limit, period, burst or factor, or exempt: true, or block: true")
		}
		return false
	default:
		ex.Action = limits.IdentityLimit
	}
	if v := &raw.Reason; v.ok() {
		ex.Reason = v.V
		if len(v.V) > maxExceptionReason {
			at("reason must be at most %d bytes, got %d", maxExceptionReason, len(v.V))
			ok = false
		}
	}
	if ok && ruleOK && ex.Action == limits.IdentityLimit {
		if _, err := ExceptionRule(r, ex); err != nil {
			var list Errors
			if errors.As(err, &list) {
				for _, e := range list {
					at("%s", e.Error())
				}
			} else {
				at("%s", err.Error())
			}
			ok = false
		}
	}
	return ok
}

// ExceptionRule returns rule r with the numbers of exception ex applied,
// checked against the bounds every rule obeys: limit and period replace
// the rule's, burst replaces it or keeps its ratio to the limit, factor
// scales limit and burst (rounded down, at least 1) last. policy.Apply
// derives a runtime override's rule with it too; the error is Errors.
func ExceptionRule(r *limits.Rule, ex *limits.Exception) (*limits.Rule, error) {
	eff := *r
	if ex.Limit > 0 {
		eff.Limit = ex.Limit
	}
	if ex.Period > 0 {
		eff.Period = ex.Period
	}
	switch {
	case !r.Algorithm.UsesBurst():
		if ex.Burst > 0 {
			return nil, Errors{fmt.Errorf("burst is only for gcra and token_bucket, not %s", r.Algorithm)}
		}
		eff.Burst = eff.Limit
	case ex.Burst > 0:
		eff.Burst = ex.Burst
	case eff.Limit != r.Limit:
		eff.Burst = max(r.Burst*eff.Limit/r.Limit, 1)
	}
	if ex.Factor > 0 {
		eff.Limit = scaleExact(eff.Limit, ex.Factor)
		if r.Algorithm.UsesBurst() {
			eff.Burst = scaleExact(eff.Burst, ex.Factor)
		} else {
			eff.Burst = eff.Limit
		}
	}
	if r.Algorithm.UsesBurst() && ex.Burst == 0 && eff.Limit > 0 && eff.Period > 0 && eff.Burst > 0 {
		// A burst the exception does not give, derived from the rule's,
		// is held to what refills within the bound: a rule override
		// raising the burst for everyone must not make a slow identity's
		// derived burst out of bounds, or its override would stop
		// applying and a lower limit fail open.
		eff.Burst = min(eff.Burst, maxFillBurst(eff.Period, eff.Limit))
	}
	if err := CheckRule(&eff); err != nil {
		return nil, err
	}
	return &eff, nil
}

// maxFillBurst is the largest burst that refills within maxSpan at limit
// per period (checkFill), at least 1.
func maxFillBurst(period time.Duration, limit int64) int64 {
	hi, lo := bits.Mul64(uint64(maxSpan), uint64(limit))
	if hi >= uint64(period) {
		return math.MaxInt64 // every burst refills in time
	}
	q, _ := bits.Div64(hi, lo, uint64(period))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return max(int64(q), 1)
}

// scaleExact returns floor(n * f), at least 1, computed exactly on the
// decimal the factor was written as: 100 * 0.29 is 29, not
// 28.999999999999996.
func scaleExact(n int64, f float64) int64 {
	rf, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if !ok {
		return max(int64(math.Floor(float64(n)*f)), 1)
	}
	x := new(big.Rat).Mul(new(big.Rat).SetInt64(n), rf)
	q := new(big.Int).Quo(x.Num(), x.Denom())
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return max(q.Int64(), 1)
}

// validateIdentityOverrides checks `identity_overrides:`.
func validateIdentityOverrides(d *decoder, raw *rawIdentityOverrides, out *IdentityOverrides) {
	out.MaxEntries = defaultMaxIdentities
	if v := &raw.MaxEntries; v.ok() {
		out.MaxEntries = int(v.V)
		if msg := between(v.V, 1, maxMaxIdentities); msg != "" {
			out.MaxEntries = defaultMaxIdentities
			d.add(v.Line, "identity_overrides.max_entries", "%s", msg)
		}
	}
}

// describeExceptions writes a rule's exceptions as -check prints them.
func describeExceptions(b *strings.Builder, r *limits.Rule) {
	for _, ex := range r.Exceptions {
		who := limits.JoinPairs(ex.Match, ", ")
		what := ex.Action.String()
		if ex.Action == limits.IdentityLimit {
			if eff, err := ExceptionRule(r, &ex); err == nil {
				what = fmt.Sprintf("%d per %s", eff.Limit, FormatDuration(eff.Period))
				if r.Algorithm.UsesBurst() {
					what += fmt.Sprintf(", burst %d", eff.Burst)
				}
			}
		}
		if ex.Reason != "" {
			what += " (" + ex.Reason + ")"
		}
		fmt.Fprintf(b, "  %-11s %s: %s\n", "exception:", who, what)
	}
}
