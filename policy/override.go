package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
)

// Override changes one rule at run time. Zero fields are not set. It is
// stored as JSON (in Redis: one hash field per rule), so every instance and
// every restart applies it until it is deleted or expires.
//
// Example: {"factor":1.5,"reason":"black friday","ttl":"6h"} makes a rule of
// 100 per minute allow 150 per minute for six hours.
type Override struct {
	// Limit replaces the file's limit.
	Limit int64 `json:"limit,omitempty"`
	// Period replaces the file's period.
	Period Duration `json:"period,omitempty"`
	// Burst replaces the file's burst (gcra and token_bucket only). When
	// not given, the burst keeps its ratio to the limit: a burst equal to
	// the limit stays equal to it.
	Burst int64 `json:"burst,omitempty"`
	// Factor scales the limit (and the burst) after Limit and Burst are
	// applied, rounded down, at least 1: 1.5 during a sale, 0.5 while the
	// backend struggles.
	Factor float64 `json:"factor,omitempty"`
	// Reason is free text for the operators who read GET /v1/rules.
	Reason string `json:"reason,omitempty"`
	// SetAt is when the override was set.
	SetAt time.Time `json:"set_at"`
	// ExpiresAt, when set, ends the override by itself (from the request's
	// "ttl").
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Duration is a time.Duration written as a config-file duration ("1m", "7d").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(config.FormatDuration(time.Duration(d)))
}

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("must be a duration string such as \"1m\", got %s", b)
	}
	v, err := config.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Limits of an override request beyond what config.CheckRule enforces.
const (
	maxFactor    = 1000.0
	maxReasonLen = 200
	maxTTL       = 400 * 24 * time.Hour
)

// ParseOverride reads a PUT /v1/rules/{name}/override body. Every problem is
// reported, each naming its field ("limit: must be an integer, got 1.5").
// now stamps SetAt and turns "ttl" into ExpiresAt.
func ParseOverride(body []byte, now time.Time) (Override, error) {
	var o Override
	var errs []string
	fail := func(field, format string, args ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, args...))
	}
	raw, err := readObject(body)
	var twice FieldErrors
	switch {
	case errors.As(err, &twice):
		return o, twice
	case errors.Is(err, errTrailing):
		return o, errors.New("body must hold exactly one JSON object")
	case err != nil || raw == nil:
		return o, fmt.Errorf(`body must be a JSON object such as {"limit":100,"period":"1m","burst":100,"factor":1.5}: %v`, errOr(err, "got null"))
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	given := 0
	f := overrideFields{Limit: &o.Limit, Burst: &o.Burst, Period: &o.Period, Factor: &o.Factor, Reason: &o.Reason, ExpiresAt: &o.ExpiresAt}
	for _, k := range keys {
		known, number := f.parse(k, raw[k], now, fail)
		switch {
		case !known:
			fail(k, "unknown field; use limit, period, burst, factor, reason or ttl")
		case number:
			given++
		}
	}
	if len(errs) == 0 && given == 0 {
		errs = append(errs, "body: give at least one of limit, period, burst, factor")
	}
	if len(errs) > 0 {
		return Override{}, FieldErrors(errs)
	}
	o.SetAt = now.UTC()
	return o, nil
}

// overrideFields points at the fields a rule override and an identity
// override share, so that one parser reads both bodies alike.
type overrideFields struct {
	Limit, Burst *int64
	Period       *Duration
	Factor       *float64
	Reason       *string
	ExpiresAt    **time.Time
}

// parse reads the shared field k of an override body. known is false for
// a field it does not know; number says it set one of limit, period, burst
// and factor. Problems go to fail, naming k.
func (f overrideFields) parse(k string, v json.RawMessage, now time.Time, fail func(field, format string, args ...any)) (known, number bool) {
	switch k {
	case "limit", "burst":
		n, err := jsonInt(v)
		switch {
		case err != nil:
			fail(k, "%v", err)
			return true, false
		case n < 1:
			fail(k, "must be >= 1, got %d", n)
			return true, false
		case k == "limit":
			*f.Limit = n
		default:
			*f.Burst = n
		}
		return true, true
	case "period":
		var d Duration
		switch err := json.Unmarshal(v, &d); {
		case err != nil:
			fail(k, "%v", err)
			return true, false
		case d <= 0:
			fail(k, "must be > 0, got %s", config.FormatDuration(time.Duration(d)))
			return true, false
		default:
			*f.Period = d
		}
		return true, true
	case "factor":
		var x float64
		switch err := json.Unmarshal(v, &x); {
		case err != nil:
			fail(k, "must be a number such as 1.5, got %s", v)
			return true, false
		case !(x > 0) || x > maxFactor || math.IsInf(x, 0):
			fail(k, "must be > 0 and <= %g, got %s", maxFactor, v)
			return true, false
		default:
			*f.Factor = x
		}
		return true, true
	case "reason":
		switch err := json.Unmarshal(v, f.Reason); {
		case err != nil:
			fail(k, "must be a string, got %s", v)
		case len(*f.Reason) > maxReasonLen:
			fail(k, "must be at most %d bytes, got %d", maxReasonLen, len(*f.Reason))
		}
		return true, false
	case "ttl":
		var d Duration
		switch err := json.Unmarshal(v, &d); {
		case err != nil:
			fail(k, "%v", err)
		case time.Duration(d) < time.Millisecond || time.Duration(d) > maxTTL:
			// under a millisecond the override would be stored already
			// ended: its end is read on each instance's clock (ExpiresAt,
			// not a Redis key expiry), and storing it takes a Redis round
			// trip, about that long
			fail(k, "must be >= 1ms and <= %s, got %s", config.FormatDuration(maxTTL), config.FormatDuration(time.Duration(d)))
		default:
			exp := now.Add(time.Duration(d)).UTC()
			*f.ExpiresAt = &exp
		}
		return true, false
	}
	return false, false
}

// FieldErrors is every problem with an override, one per field (a 400).
type FieldErrors []string

func (e FieldErrors) Error() string { return strings.Join(e, "; ") }

// errTrailing is readObject's error when the body goes on after its object.
var errTrailing = errors.New("more after the JSON object")

// readObject reads body as one JSON object, its fields unparsed; nil, with
// a nil error, for a JSON null. Errors: errTrailing when more follows the
// object, FieldErrors ("limit: given twice", in the order they came) when
// a field is given more than once (decoded into a map,
// {"limit":5,"limit":1000000} would be a limit of a million without a
// word, and which copy was meant is unknown), or the syntax error.
func readObject(body []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	switch {
	case err != nil:
		return nil, err
	case tok == nil:
		return nil, nil
	case tok != json.Delim('{'):
		return nil, fmt.Errorf("got %s", jsonKind(tok))
	}
	fields := map[string]json.RawMessage{}
	var twice FieldErrors
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := tok.(string) // an object's keys are strings, or Token fails
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, seen := fields[k]; seen && !slices.Contains(twice, k+": given twice") {
			twice = append(twice, k+": given twice")
		}
		fields[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	// Only white space may follow: More would not see a stray "}" or "]".
	if _, err := dec.Token(); err != io.EOF {
		return nil, errTrailing
	}
	if twice != nil {
		return nil, twice
	}
	return fields, nil
}

// jsonKind names the kind of JSON value a first token starts.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "true or false"
	default:
		return "a number"
	}
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// jsonInt reads a JSON number that must be a whole number.
func jsonInt(v json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(v))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("must be a whole number, got %s", s)
	}
	return n, nil
}

// Apply returns the rule r with o applied, checked against the bounds a
// config file must obey. r is not modified; the result shares r's match and
// key, which are immutable.
func Apply(r *limits.Rule, o *Override) (*limits.Rule, error) {
	if o.Burst > 0 && !r.Algorithm.UsesBurst() {
		return nil, FieldErrors{fmt.Sprintf("burst: is only for gcra and token_bucket, not %s", r.Algorithm)}
	}
	// The same derivation as a config file exception's.
	eff, err := config.ExceptionRule(r, &limits.Exception{Limit: o.Limit, Period: time.Duration(o.Period), Burst: o.Burst, Factor: o.Factor})
	if err != nil {
		var msgs FieldErrors
		var list config.Errors
		if errors.As(err, &list) {
			for _, e := range list {
				msgs = append(msgs, withFactor(e.Error(), o))
			}
		} else {
			msgs = append(msgs, withFactor(err.Error(), o))
		}
		return nil, msgs
	}
	return eff, nil
}

// withFactor turns CheckRule's "limit must be ..." into "limit: must be ...",
// saying when the factor is why.
func withFactor(msg string, o *Override) string {
	if field, rest, ok := strings.Cut(msg, " "); ok {
		switch field {
		case "limit", "burst", "period", "cost":
			msg = field + ": " + rest
		}
	}
	if o.Factor > 0 {
		msg += fmt.Sprintf(" (after factor %s)", strconv.FormatFloat(o.Factor, 'g', -1, 64))
	}
	return msg
}

// numbers is the override's limit, period, burst and factor.
func (o *Override) numbers() numbers {
	return numbers{limit: o.Limit, burst: o.Burst, period: time.Duration(o.Period), factor: o.Factor}
}

// expired reports whether o has expired at now.
func (o *Override) expired(now time.Time) bool {
	return o.ExpiresAt != nil && !now.Before(*o.ExpiresAt)
}

// OverrideStore keeps overrides where every instance can read them.
type OverrideStore interface {
	// Load returns every stored override as rule name → JSON.
	Load(ctx context.Context) (map[string]string, error)
	// Set stores one override and tells the other instances.
	Set(ctx context.Context, rule, value string) error
	// Delete removes one override and tells the other instances.
	Delete(ctx context.Context, rule string) error
	// Retire removes one override only while it is still value (an
	// expired one: never a newer one another instance set since) and
	// tells the other instances when it did.
	Retire(ctx context.Context, rule, value string) error
	// Watch returns a channel that receives whenever another instance may
	// have changed the overrides, until ctx ends; nil when the store has no
	// other instances to hear from.
	Watch(ctx context.Context) <-chan struct{}
	// Shared says whether other instances see the same overrides.
	Shared() bool
}

// MemoryOverrides keeps overrides in the process (memory-store mode).
type MemoryOverrides struct {
	mu sync.Mutex
	m  map[string]string
}

// NewMemoryOverrides returns an empty in-process override store.
func NewMemoryOverrides() *MemoryOverrides { return &MemoryOverrides{m: map[string]string{}} }

// Load implements OverrideStore.
func (s *MemoryOverrides) Load(context.Context) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := make(map[string]string, len(s.m))
	for k, v := range s.m {
		cp[k] = v
	}
	return cp, nil
}

// Set implements OverrideStore.
func (s *MemoryOverrides) Set(_ context.Context, rule, value string) error {
	s.mu.Lock()
	s.m[rule] = value
	s.mu.Unlock()
	return nil
}

// Delete implements OverrideStore.
func (s *MemoryOverrides) Delete(_ context.Context, rule string) error {
	s.mu.Lock()
	delete(s.m, rule)
	s.mu.Unlock()
	return nil
}

// Retire implements OverrideStore.
func (s *MemoryOverrides) Retire(_ context.Context, rule, value string) error {
	s.mu.Lock()
	if s.m[rule] == value {
		delete(s.m, rule)
	}
	s.mu.Unlock()
	return nil
}

// Watch implements OverrideStore: nobody else changes them.
func (s *MemoryOverrides) Watch(context.Context) <-chan struct{} { return nil }

// Shared implements OverrideStore.
func (s *MemoryOverrides) Shared() bool { return false }
