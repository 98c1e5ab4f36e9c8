// Package adaptive is the arithmetic of adaptive limits (docs/adaptive.md):
// a rule's `adaptive:` block compiled into a Spec, its table of steps with
// hysteresis, and the state machine that turns one reading of the load
// signal, or its failure, into the factor the rule's limit is scaled by.
//
// It does no I/O. Package adaptive/signal reads the signal; package policy
// elects the one instance that evaluates each rule, shares its decision
// and composes it with the manual overrides.
package adaptive

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rategate/rategate/internal/redact"
)

// Bounds and defaults of an `adaptive:` block; config validates against
// them and the docs quote them.
const (
	// MaxFactor bounds every factor, as it bounds a manual override's.
	MaxFactor = 1000.0
	// MinSteps and MaxSteps bound the table.
	MinSteps = 2
	MaxSteps = 32

	MinInterval     = time.Second
	MaxInterval     = time.Hour
	DefaultInterval = 5 * time.Second
	// DefaultTimeout is the timeout of one reading when not given (capped
	// at half the interval).
	DefaultTimeout = 2 * time.Second
	// MaxTimeout bounds a reading.
	MaxTimeout         = 30 * time.Second
	DefaultCooldown    = 30 * time.Second
	MaxCooldown        = 24 * time.Hour
	DefaultKeepOnError = time.Minute
	MaxKeepOnError     = 24 * time.Hour
	// DefaultLeaseFactor: the lease lasts this many intervals when
	// lease_ttl is not given.
	DefaultLeaseFactor = 3
	// MinLeaseFactor: the lease must last at least this many intervals, so
	// that a leader renews it in time even when one evaluation runs long.
	MinLeaseFactor = 2
	MaxLeaseTTL    = time.Hour
	// MaxQueryLen bounds a PromQL query.
	MaxQueryLen = 4096
)

// SourceKind says where the signal comes from.
type SourceKind uint8

// The signal sources.
const (
	// Prometheus: a Prometheus-compatible query API, GET
	// <url>/api/v1/query?query=<query>; an instant vector or a scalar.
	Prometheus SourceKind = iota + 1
	// HTTP: GET <url> answers one number as text.
	HTTP
)

func (k SourceKind) String() string {
	switch k {
	case Prometheus:
		return "prometheus"
	case HTTP:
		return "http"
	}
	return "?"
}

// Reduce turns an instant vector of several series into one value.
type Reduce uint8

// The reductions; Single is the default.
const (
	// Single: the query must give exactly one series (several_series
	// otherwise). Write the aggregation in PromQL.
	Single Reduce = iota
	Max
	Min
	Avg
	Sum
)

// Reduces lists every reduction in the order the docs give them.
var Reduces = []Reduce{Single, Max, Min, Avg, Sum}

func (r Reduce) String() string {
	switch r {
	case Single:
		return "single"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	case Sum:
		return "sum"
	}
	return "?"
}

// ParseReduce reads a reduction's name.
func ParseReduce(s string) (Reduce, bool) {
	for _, r := range Reduces {
		if r.String() == s {
			return r, true
		}
	}
	return Single, false
}

// Source is where one rule's signal is read.
type Source struct {
	Kind SourceKind
	// URL is the query API's base (Prometheus) or the endpoint (HTTP).
	URL string
	// Query is the PromQL expression (Prometheus only).
	Query string
	// Reduce applies to a vector of several series (Prometheus only).
	Reduce Reduce
}

// String describes the source for -check, logs and GET /v1/rules, with the
// URL's secrets hidden (redact.URL).
func (s *Source) String() string {
	u := redact.URL(s.URL)
	if s.Kind == Prometheus {
		return fmt.Sprintf("prometheus %s query %q (reduce %s)", u, s.Query, s.Reduce)
	}
	return "http " + u
}

// Step is one row of the table: signal values below Below get Factor. The
// last step's Below is +Inf (every value above the others).
type Step struct {
	Below  float64
	Factor float64
}

// Spec is a compiled `adaptive:` block. It is immutable once built and
// shared, like the rule that carries it.
type Spec struct {
	Source Source
	// Steps are in increasing order of Below; the last one's is +Inf.
	Steps []Step
	// Hysteresis, in the signal's unit: the factor leaves its step only
	// when the signal is past the step's edge by more than this.
	Hysteresis float64
	// MinFactor <= 1 <= MaxFactor bound every factor written or applied.
	MinFactor, MaxFactor float64
	// Interval between two evaluations.
	Interval time.Duration
	// Timeout of one reading (< Interval).
	Timeout time.Duration
	// Cooldown is the least time between a change of the factor and a
	// raise of it (a lowering is never held back).
	Cooldown time.Duration
	// KeepOnError is how long a failing signal keeps the last factor
	// before it returns to 1.
	KeepOnError time.Duration
	// KeepRaiseOnError is the same for a factor above 1 (<= KeepOnError):
	// a signal served by the backend it protects fails precisely under
	// load, and a raise it granted while idle should not outlive it.
	KeepRaiseOnError time.Duration
	// LeaseTTL is the lease of the instance that evaluates the rule: when
	// it dies, another takes over within LeaseTTL plus one Interval.
	LeaseTTL time.Duration
}

// Signature is every field of the spec in one string, to tell two specs
// apart (a reload that changed the block). It may hold a URL's password:
// compare it, never print it.
func (s *Spec) Signature() string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("%d|%s|%s|%d|%v|%g|%g|%g|%d|%d|%d|%d|%d|%d", s.Source.Kind, s.Source.URL, s.Source.Query,
		s.Source.Reduce, s.Steps, s.Hysteresis, s.MinFactor, s.MaxFactor, s.Interval, s.Timeout, s.Cooldown,
		s.KeepOnError, s.KeepRaiseOnError, s.LeaseTTL)
}

// DescribeSteps writes the table as -check and the docs show it:
// "below 50: x1.5; below 80: x1; above: x0.8".
func (s *Spec) DescribeSteps() string {
	parts := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		if i == len(s.Steps)-1 {
			parts[i] = "above: x" + FormatFactor(st.Factor)
			continue
		}
		parts[i] = fmt.Sprintf("below %s: x%s", strconv.FormatFloat(st.Below, 'g', -1, 64), FormatFactor(st.Factor))
	}
	return strings.Join(parts, "; ")
}

// FormatFactor writes a factor as its shortest decimal ("1.5", "0.8").
func FormatFactor(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// Clamp bounds f to [MinFactor, MaxFactor]; anything that is not a
// positive finite number is 1. The one place a factor read from the shared
// store is made safe to apply, whoever wrote it.
func (s *Spec) Clamp(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		return 1
	}
	return min(max(f, s.MinFactor), s.MaxFactor)
}

// plainStep is the step of v without hysteresis: the first whose Below is
// above v.
func (s *Spec) plainStep(v float64) int {
	for i, st := range s.Steps {
		if v < st.Below {
			return i
		}
	}
	return len(s.Steps) - 1
}

// StepFor returns the step the signal v selects when the factor is at
// step cur (-1: none). The factor stays at cur while v is inside cur's
// range widened by Hysteresis on both sides; past that, the step is the
// one v falls into. With steps below 50 and below 80 and hysteresis 5, a
// factor at the middle step (50..80) stays there from 45 up to 85.
func (s *Spec) StepFor(v float64, cur int) int {
	plain := s.plainStep(v)
	if cur < 0 || cur >= len(s.Steps) || plain == cur {
		return plain
	}
	lo, hi := math.Inf(-1), math.Inf(1)
	if cur > 0 {
		lo = s.Steps[cur-1].Below - s.Hysteresis
	}
	if cur < len(s.Steps)-1 {
		hi = s.Steps[cur].Below + s.Hysteresis
	}
	if v >= lo && v < hi {
		return cur
	}
	return plain
}

// Reason names why a reading failed: the reason label of
// rategate_adaptive_evaluation_errors_total and the log's "reason".
type Reason uint8

// The reasons a reading fails.
const (
	// Unreachable: no connection, DNS failure, reset, refused.
	Unreachable Reason = iota
	// Timeout: no complete answer within the timeout.
	Timeout
	// BadStatus: the answer was not a 2xx, or Prometheus said "error".
	BadStatus
	// TooLarge: the answer was longer than rategate reads.
	TooLarge
	// NotANumber: the answer is not a number, or not the JSON of an
	// instant vector or a scalar.
	NotANumber
	// NaN: the value is NaN.
	NaN
	// Infinite: the value is +Inf or -Inf (or too large for a float64).
	Infinite
	// Empty: the query gave no series.
	Empty
	// SeveralSeries: the query gave several series and reduce is single.
	SeveralSeries
	// NumReasons counts the reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{"unreachable", "timeout", "bad_status", "too_large", "not_a_number",
	"nan", "infinite", "empty", "several_series"}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "?"
}

// ParseReason reads a reason's name; ok is false for an unknown one.
func ParseReason(s string) (Reason, bool) {
	for i, n := range reasonNames {
		if n == s {
			return Reason(i), true
		}
	}
	return 0, false
}

// Error is a failed reading.
type Error struct {
	Reason Reason
	// Detail says what happened, in rategate's words; any text quoted from
	// the answer is short and escaped.
	Detail string
}

func (e *Error) Error() string { return e.Reason.String() + ": " + e.Detail }

// ReasonOf returns the reason of a failed reading: its Error's, else
// Unreachable.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return Unreachable
}
