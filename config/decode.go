package config

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The file is read in two steps: yaml.v3 parses it into a node tree, then the
// decoder below walks the tree against the known keys of each section. Doing
// the walk ourselves (rather than yaml's Decoder.KnownFields) lets every
// problem name its section, rule and field, keeps going after the first
// problem, and records which keys were present so validation can tell
// "burst: 0" from no burst at all.

// opt is one value read from the file.
type opt[T any] struct {
	V T
	// Set is true when the key is present in the file.
	Set bool
	// Bad is true when the key is present but its value could not be read
	// (already reported); validation then leaves the field alone.
	Bad  bool
	Line int
}

// ok reports whether the value is present and readable.
func (o *opt[T]) ok() bool { return o.Set && !o.Bad }

// section is embedded in every mapping of the file.
type section struct {
	Set  bool
	Bad  bool
	Line int
}

func (s *section) sec() *section { return s }

// field ties a YAML key to where its value goes: an *opt[T], a nested
// section (fielder) or the rule list.
type field struct {
	key string
	dst any
}

// fielder is a mapping of the file.
type fielder interface {
	sec() *section
	fields() []field
}

type rawConfig struct {
	section
	Listen      opt[string]
	LogLevel    opt[string]
	Redis       rawRedis
	FailureMode opt[string]
	LocalShare  opt[int64]
	DenyStatus  opt[int64]
	MemoryKeys  opt[int64]
	DenyCache   rawDenyCache
	Admin       rawAdmin
	Identity    rawIdentity
	IdentityOvr rawIdentityOverrides
	Rules       opt[[]rawRule]
}

func (c *rawConfig) fields() []field {
	return []field{
		{"listen", &c.Listen},
		{"log_level", &c.LogLevel},
		{"redis", &c.Redis},
		{"failure_mode", &c.FailureMode},
		{"local_share", &c.LocalShare},
		{"deny_status", &c.DenyStatus},
		{"memory_max_keys", &c.MemoryKeys},
		{"deny_cache", &c.DenyCache},
		{"admin", &c.Admin},
		{"identity", &c.Identity},
		{"identity_overrides", &c.IdentityOvr},
		{"rules", &c.Rules},
	}
}

type rawRedis struct {
	section
	URL          opt[string]
	ClusterAddrs opt[[]string]
	Sentinel     rawSentinel
	TLS          rawTLS
	Username     opt[string]
	Password     opt[string]
	KeyPrefix    opt[string]
	Timeout      opt[time.Duration]
	Coalesce     rawCoalesce
	Functions    opt[bool]
}

func (r *rawRedis) fields() []field {
	return []field{
		{"url", &r.URL},
		{"cluster_addrs", &r.ClusterAddrs},
		{"sentinel", &r.Sentinel},
		{"tls", &r.TLS},
		{"username", &r.Username},
		{"password", &r.Password},
		{"key_prefix", &r.KeyPrefix},
		{"timeout", &r.Timeout},
		{"coalesce", &r.Coalesce},
		{"functions", &r.Functions},
	}
}

type rawDenyCache struct {
	section
	Enabled    opt[bool]
	MaxEntries opt[int64]
}

func (c *rawDenyCache) fields() []field {
	return []field{
		{"enabled", &c.Enabled},
		{"max_entries", &c.MaxEntries},
	}
}

type rawCoalesce struct {
	section
	Enabled   opt[bool]
	Pipelines opt[int64]
	MaxBatch  opt[int64]
	Wait      opt[time.Duration]
	Overlap   opt[time.Duration]
}

func (c *rawCoalesce) fields() []field {
	return []field{
		{"enabled", &c.Enabled},
		{"pipelines", &c.Pipelines},
		{"max_batch", &c.MaxBatch},
		{"wait", &c.Wait},
		{"overlap_after", &c.Overlap},
	}
}

type rawSentinel struct {
	section
	Master   opt[string]
	Addrs    opt[[]string]
	Username opt[string]
	Password opt[string]
}

func (s *rawSentinel) fields() []field {
	return []field{
		{"master", &s.Master},
		{"addrs", &s.Addrs},
		{"username", &s.Username},
		{"password", &s.Password},
	}
}

type rawTLS struct {
	section
	Enabled            opt[bool]
	CAFile             opt[string]
	CertFile           opt[string]
	KeyFile            opt[string]
	ServerName         opt[string]
	InsecureSkipVerify opt[bool]
}

func (t *rawTLS) fields() []field {
	return []field{
		{"enabled", &t.Enabled},
		{"ca_file", &t.CAFile},
		{"cert_file", &t.CertFile},
		{"key_file", &t.KeyFile},
		{"server_name", &t.ServerName},
		{"insecure_skip_verify", &t.InsecureSkipVerify},
	}
}

type rawAdmin struct {
	section
	Token  opt[string]
	Listen opt[string]
}

func (a *rawAdmin) fields() []field {
	return []field{
		{"token", &a.Token},
		{"listen", &a.Listen},
	}
}

type rawIdentity struct {
	section
	UserHeader     opt[string]
	IPHeader       opt[string]
	TrustedProxies opt[[]string]
	Anonymous      opt[string]
	URIHeader      opt[string]
	MethodHeader   opt[string]
	HostHeader     opt[string]
	CostHeader     opt[string]
	MaxCost        opt[int64]
	URLHeader      opt[string]
	RequestID      opt[string]
	IPv6Prefix     opt[int64]
	PathParams     opt[string]
}

func (i *rawIdentity) fields() []field {
	return []field{
		{"user_header", &i.UserHeader},
		{"ip_header", &i.IPHeader},
		{"trusted_proxies", &i.TrustedProxies},
		{"anonymous", &i.Anonymous},
		{"uri_header", &i.URIHeader},
		{"method_header", &i.MethodHeader},
		{"host_header", &i.HostHeader},
		{"cost_header", &i.CostHeader},
		{"max_cost", &i.MaxCost},
		{"url_header", &i.URLHeader},
		{"request_id_header", &i.RequestID},
		{"ipv6_prefix", &i.IPv6Prefix},
		{"path_parameters", &i.PathParams},
	}
}

type rawRule struct {
	section
	// label names the rule in errors: `rules[2] "login"`, or `rules[2]`
	// when it has no usable name.
	label      string
	Name       opt[string]
	Match      rawMatch
	Key        opt[[]string]
	Algorithm  opt[string]
	Limit      opt[int64]
	Period     opt[time.Duration]
	Burst      opt[int64]
	Cost       opt[int64]
	Shadow     opt[bool]
	Exceptions opt[[]rawException]
	Adaptive   rawAdaptive
	Lease      opt[bool]
}

func (r *rawRule) fields() []field {
	return []field{
		{"name", &r.Name},
		{"match", &r.Match},
		{"key", &r.Key},
		{"algorithm", &r.Algorithm},
		{"limit", &r.Limit},
		{"period", &r.Period},
		{"burst", &r.Burst},
		{"cost", &r.Cost},
		{"shadow", &r.Shadow},
		{"adaptive", &r.Adaptive},
		{"exceptions", &r.Exceptions},
		{"lease", &r.Lease},
	}
}

type rawMatch struct {
	section
	Path    opt[string]
	Methods opt[[]string]
	Host    opt[string]
	Header  opt[[]headerValue]
}

func (m *rawMatch) fields() []field {
	return []field{
		{"path", &m.Path},
		{"methods", &m.Methods},
		{"host", &m.Host},
		{"header", &m.Header},
	}
}

// headerValue is one `match.header` entry, in file order.
type headerValue struct {
	Name, Value string
	Line        int
}

// problem is one validation error before it is rendered.
type problem struct {
	line  int // orders problems; 0 when unknown
	label string
	msg   string
}

// decoder collects problems while reading and validating one file.
type decoder struct {
	probs []problem
}

// add records a problem; label is the section or rule ("" for the top level).
func (d *decoder) add(line int, label, format string, args ...any) {
	d.probs = append(d.probs, problem{line: line, label: label, msg: fmt.Sprintf(format, args...)})
}

// errors renders the problems in file order, nil when there are none.
func (d *decoder) errors(file string) Errors {
	if len(d.probs) == 0 {
		return nil
	}
	sort.SliceStable(d.probs, func(i, j int) bool { return d.probs[i].line < d.probs[j].line })
	errs := make(Errors, 0, len(d.probs))
	seen := make(map[string]bool, len(d.probs))
	for _, p := range d.probs {
		s := file + ": "
		if p.label != "" {
			s += p.label + ": "
		}
		s += p.msg
		// A problem inside a merged (<<) mapping is met once per merge.
		if !seen[s] {
			seen[s] = true
			errs = append(errs, errors.New(s))
		}
	}
	return errs
}

// where is the position of a mapping in the file, for messages.
type where struct {
	// label is the section path ("redis.sentinel") or the rule
	// (`rules[2] "login"`); "" at the top level.
	label string
	// rule is true inside a rule, where field names go into the message
	// (`rules[2] "login": burst must be ...`) rather than into the label.
	rule bool
	// sub is the path of a nested mapping inside a rule, "match.".
	sub string
}

// child is the position of the mapping under key.
func (w where) child(key string) where {
	if w.rule {
		return where{label: w.label, rule: true, sub: w.sub + key + "."}
	}
	return where{label: joinPath(w.label, key)}
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

// fieldErr reports a value that could not be read.
func (d *decoder) fieldErr(w where, key string, line int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if w.rule {
		d.add(line, w.label, "line %d: %s%s %s", line, w.sub, key, msg)
		return
	}
	d.add(line, joinPath(w.label, key), "line %d: %s", line, msg)
}

// fields reads mapping n into f.
func (d *decoder) fields(n *yaml.Node, w where, f fielder) {
	n = resolve(n)
	s := f.sec()
	s.Set, s.Line = true, n.Line
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		s.Bad = true
		d.add(n.Line, w.label, "line %d: must be a mapping of keys to values, got %s", n.Line, got(n))
		return
	}
	fs := f.fields()
	for _, p := range d.pairs(n, w) {
		var dst any
		for _, fl := range fs {
			if fl.key == p.key.Value {
				dst = fl.dst
				break
			}
		}
		if dst == nil {
			d.unknown(w, p.key, fs)
			continue
		}
		d.value(p.val, w, p.key.Value, dst)
	}
}

// unknown reports a key the section does not have, with a suggestion when
// the key looks like a typo of a known one.
func (d *decoder) unknown(w where, k *yaml.Node, fs []field) {
	hint, best := "", 3 // suggest only within edit distance 2
	for _, f := range fs {
		if dist := editDistance(k.Value, f.key); dist < best {
			hint, best = fmt.Sprintf(" (did you mean %q?)", f.key), dist
		}
	}
	in := ""
	if w.sub != "" {
		in = " in " + strings.TrimSuffix(w.sub, ".")
	}
	d.add(k.Line, w.label, "line %d: unknown key %q%s%s", k.Line, k.Value, in, hint)
}

type pair struct{ key, val *yaml.Node }

// maxMergeDepth bounds nested << merges and alias chains.
const maxMergeDepth = 8

// pairs returns the key/value pairs of mapping n, with YAML merge keys
// (<<: *defaults) expanded: explicit keys win over merged ones, earlier
// merges over later ones. A repeated key is reported and its repeat ignored.
func (d *decoder) pairs(n *yaml.Node, w where) []pair {
	// Each mapping is merged at most once per call: a repeat adds nothing,
	// and this keeps alias cycles and diamonds of anchors from blowing up.
	return d.mergedPairs(n, w, map[*yaml.Node]bool{n: true}, 0)
}

func (d *decoder) mergedPairs(n *yaml.Node, w where, merged map[*yaml.Node]bool, depth int) []pair {
	var own, more []pair
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			more = append(more, d.merge(v, w, merged, depth)...)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.add(k.Line, w.label, "line %d: a key must be a plain string, got %s", k.Line, got(k))
			continue
		}
		if line, dup := first[k.Value]; dup {
			d.add(k.Line, w.label, "line %d: key %q is repeated (first on line %d)", k.Line, k.Value, line)
			continue
		}
		first[k.Value] = k.Line
		own = append(own, pair{k, v})
	}
	for _, p := range more {
		if _, dup := first[p.key.Value]; !dup {
			first[p.key.Value] = p.key.Line
			own = append(own, p)
		}
	}
	return own
}

// merge returns the pairs a << key brings in.
func (d *decoder) merge(v *yaml.Node, w where, merged map[*yaml.Node]bool, depth int) []pair {
	if depth >= maxMergeDepth {
		d.add(v.Line, w.label, "line %d: merge keys (<<) nested more than %d deep", v.Line, maxMergeDepth)
		return nil
	}
	sources := []*yaml.Node{resolve(v)}
	switch sources[0].Kind {
	case yaml.MappingNode:
	case yaml.SequenceNode:
		sources = sources[0].Content
	default:
		d.add(v.Line, w.label, "line %d: << must merge a mapping or a list of mappings, got %s", v.Line, got(sources[0]))
		return nil
	}
	var out []pair
	for _, m := range sources {
		if m = resolve(m); m.Kind != yaml.MappingNode {
			d.add(m.Line, w.label, "line %d: << must merge mappings, got %s", m.Line, got(m))
			continue
		}
		if !merged[m] {
			merged[m] = true
			out = append(out, d.mergedPairs(m, w, merged, depth+1)...)
		}
	}
	return out
}

// value reads n, the value of key, into dst.
func (d *decoder) value(n *yaml.Node, w where, key string, dst any) {
	n = resolve(n)
	switch p := dst.(type) {
	case *opt[string]:
		p.Set, p.Line = true, n.Line
		s, ok := scalarString(n)
		if !ok {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be a string, got %s", got(n))
		}
		p.V = s
	case *opt[int64]:
		p.Set, p.Line = true, n.Line
		switch {
		case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && digitsRE.MatchString(n.Value):
			p.Bad = true // yaml.v3 reads an integer too large for int64 as a float
			d.fieldErr(w, key, n.Line, "is out of range, got %s", n.Value)
		case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int":
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be a whole number, got %s", got(n))
		}
		if p.Bad {
			break
		}
		if err := n.Decode(&p.V); err != nil {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "is out of range, got %s", n.Value)
		}
	case *opt[float64]:
		p.Set, p.Line = true, n.Line
		tag := n.ShortTag()
		if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&p.V) != nil {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be a number, got %s", got(n))
		}
	case *opt[[]rawStep]:
		d.steps(n, w, key, p)
	case *opt[bool]:
		p.Set, p.Line = true, n.Line
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&p.V) != nil {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be true or false, got %s", got(n))
		}
	case *opt[time.Duration]:
		p.Set, p.Line = true, n.Line
		v, err := durationNode(n)
		if err != nil {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "%v", err)
		}
		p.V = v
	case *opt[[]string]:
		p.Set, p.Line = true, n.Line
		if isNull(n) {
			return
		}
		if n.Kind != yaml.SequenceNode {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be a list such as [a, b], got %s", got(n))
			return
		}
		for i, item := range n.Content {
			item = resolve(item)
			s, ok := scalarString(item)
			if !ok || isNull(item) {
				p.Bad = true
				d.fieldErr(w, fmt.Sprintf("%s[%d]", key, i), item.Line, "must be a string, got %s", got(item))
				continue
			}
			p.V = append(p.V, s)
		}
	case *opt[[]headerValue]:
		p.Set, p.Line = true, n.Line
		if isNull(n) {
			return
		}
		if n.Kind != yaml.MappingNode {
			p.Bad = true
			d.fieldErr(w, key, n.Line, "must be a mapping of header names to values such as {X-Plan: free}, got %s", got(n))
			return
		}
		for _, kv := range d.pairs(n, w) {
			v := resolve(kv.val)
			s, ok := scalarString(v)
			if !ok {
				p.Bad = true
				d.fieldErr(w, fmt.Sprintf("%s %q", key, kv.key.Value), v.Line, "must be a string, got %s", got(v))
				continue
			}
			p.V = append(p.V, headerValue{Name: kv.key.Value, Value: s, Line: kv.key.Line})
		}
	case *opt[[]rawRule]:
		d.rules(n, w, key, p)
	case *opt[[]rawException]:
		d.exceptions(n, w, key, p)
	case fielder:
		if !isNull(n) && n.Kind != yaml.MappingNode {
			s := p.sec()
			s.Set, s.Bad, s.Line = true, true, n.Line
			d.fieldErr(w, key, n.Line, "must be a mapping of keys to values, got %s", got(n))
			return
		}
		d.fields(n, w.child(key), p)
	default:
		panic(fmt.Sprintf("config: no decoder for %T", dst)) // a programming error in fields()
	}
}

// rules reads the rule list.
func (d *decoder) rules(n *yaml.Node, w where, key string, p *opt[[]rawRule]) {
	p.Set, p.Line = true, n.Line
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Bad = true
		d.fieldErr(w, key, n.Line, "must be a list of rules (each starting with \"- name: ...\"), got %s", got(n))
		return
	}
	p.V = make([]rawRule, len(n.Content))
	for i, item := range n.Content {
		r := &p.V[i]
		item = resolve(item)
		r.label = fmt.Sprintf("rules[%d]", i)
		if name := peekName(item); name != "" {
			r.label += " " + strconv.Quote(name)
		}
		if item.Kind != yaml.MappingNode {
			r.Set, r.Bad, r.Line = true, true, item.Line
			d.add(item.Line, r.label, "line %d: a rule must be a mapping (name:, match:, key:, algorithm:, limit:, period:, ...), got %s", item.Line, got(item))
			continue
		}
		d.fields(item, where{label: r.label, rule: true}, r)
	}
}

// steps reads a list of mappings such as adaptive.steps.
func (d *decoder) steps(n *yaml.Node, w where, key string, p *opt[[]rawStep]) {
	p.Set, p.Line = true, n.Line
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Bad = true
		d.fieldErr(w, key, n.Line, "must be a list of steps such as [{below: 50, factor: 1.5}, {factor: 1}], got %s", got(n))
		return
	}
	p.V = make([]rawStep, len(n.Content))
	for i, item := range n.Content {
		item = resolve(item)
		name := fmt.Sprintf("%s[%d]", key, i)
		if item.Kind != yaml.MappingNode {
			s := &p.V[i]
			s.Set, s.Bad, s.Line = true, true, item.Line
			d.fieldErr(w, name, item.Line, "must be a mapping such as {below: 50, factor: 1.5}, got %s", got(item))
			continue
		}
		d.fields(item, w.child(name), &p.V[i])
	}
}

// peekName returns the name of a rule mapping for its label, "" if none.
func peekName(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	var quiet decoder // problems are reported when the rule itself is read
	for _, p := range quiet.pairs(n, where{}) {
		if p.key.Value == "name" {
			if s, ok := scalarString(resolve(p.val)); ok {
				return s
			}
		}
	}
	return ""
}

// resolve follows an alias (*anchor) to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < maxMergeDepth; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// scalarString returns a scalar's text as written ("" for null), so that
// `token: 0123` stays "0123". ok is false for lists and mappings.
func scalarString(n *yaml.Node) (s string, ok bool) {
	if n.Kind != yaml.ScalarNode {
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

// got describes a node for "must be X, got Y" messages.
func got(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!str":
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "an alias"
}

// durationNode reads a duration written as a string with a unit.
func durationNode(n *yaml.Node) (time.Duration, error) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int", "!!float":
			return 0, fmt.Errorf("must be a duration with a unit, such as \"%ss\" or \"%sms\", got %s", n.Value, n.Value, n.Value)
		case "!!str":
			return ParseDuration(n.Value)
		}
	}
	return 0, fmt.Errorf("must be a duration such as \"50ms\", \"1m\" or \"7d\", got %s", got(n))
}

// maxDays keeps day counts far from time.Duration's ~106751-day range.
const maxDays = 100000

var (
	daysPrefix = regexp.MustCompile(`^([0-9]+)d(.*)$`)
	digitsRE   = regexp.MustCompile(`^[-+]?[0-9_]+$`)
)

// ParseDuration parses a Go duration (time.ParseDuration: "500ms", "1m",
// "1h30m") that may also start with a whole number of days: "1d", "7d",
// "1d12h". The admin override API parses periods with it too.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not a duration (examples: 500ms, 1m, 1h30m, 7d)", s)
	s = strings.TrimSpace(s)
	m := daysPrefix.FindStringSubmatch(s)
	if m == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		return d, nil
	}
	days, err := strconv.Atoi(m[1])
	if err != nil || days > maxDays {
		return 0, fmt.Errorf("%q is too long: no period, ttl or other duration rategate takes is over %s", s, FormatDuration(maxSpan))
	}
	d := time.Duration(days) * 24 * time.Hour
	if m[2] == "" {
		return d, nil
	}
	if c := m[2][0]; c == '+' || c == '-' {
		return 0, bad
	}
	rest, err := time.ParseDuration(m[2])
	if err != nil || rest > time.Duration(maxDays)*24*time.Hour {
		return 0, bad
	}
	return d + rest, nil
}

// FormatDuration writes d the way a config file would: "7d", "1m", "1h30m",
// "1.5ms". ParseDuration reads it back.
func FormatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// editDistance is the Levenshtein distance of a and b (short ASCII keys).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
