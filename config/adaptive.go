package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rategate/rategate/adaptive"
	"github.com/rategate/rategate/limits"
)

// A rule's `adaptive:` block (docs/adaptive.md): its limit follows a load
// signal through a table of steps. Its bounds and defaults are package
// adaptive's; this file reads and checks the block.

type rawAdaptive struct {
	section
	Prometheus  rawPromSource
	HTTP        rawHTTPSource
	Reduce      opt[string]
	Steps       opt[[]rawStep]
	Hysteresis  opt[float64]
	MinFactor   opt[float64]
	MaxFactor   opt[float64]
	Interval    opt[time.Duration]
	Timeout     opt[time.Duration]
	Cooldown    opt[time.Duration]
	KeepOnError opt[time.Duration]
	KeepRaise   opt[time.Duration]
	LeaseTTL    opt[time.Duration]
}

func (a *rawAdaptive) fields() []field {
	return []field{
		{"prometheus", &a.Prometheus},
		{"http", &a.HTTP},
		{"reduce", &a.Reduce},
		{"steps", &a.Steps},
		{"hysteresis", &a.Hysteresis},
		{"min_factor", &a.MinFactor},
		{"max_factor", &a.MaxFactor},
		{"interval", &a.Interval},
		{"timeout", &a.Timeout},
		{"cooldown", &a.Cooldown},
		{"keep_on_error", &a.KeepOnError},
		{"keep_raise_on_error", &a.KeepRaise},
		{"lease_ttl", &a.LeaseTTL},
	}
}

type rawPromSource struct {
	section
	URL   opt[string]
	Query opt[string]
}

func (p *rawPromSource) fields() []field {
	return []field{{"url", &p.URL}, {"query", &p.Query}}
}

type rawHTTPSource struct {
	section
	URL opt[string]
}

func (h *rawHTTPSource) fields() []field { return []field{{"url", &h.URL}} }

// rawStep is one `adaptive.steps` entry.
type rawStep struct {
	section
	Below  opt[float64]
	Factor opt[float64]
}

func (s *rawStep) fields() []field { return []field{{"below", &s.Below}, {"factor", &s.Factor}} }

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// compileAdaptive checks rule r's `adaptive:` block and builds its Spec;
// nil when the rule has none. at reports a problem under the rule's label.
func compileAdaptive(ra *rawAdaptive, r *limits.Rule, at func(line int, format string, args ...any)) *adaptive.Spec {
	if !ra.Set || ra.Bad {
		return nil
	}
	s := &adaptive.Spec{Cooldown: adaptive.DefaultCooldown, KeepOnError: adaptive.DefaultKeepOnError}
	line := func(l int) int {
		if l == 0 {
			return ra.Line
		}
		return l
	}

	prom, web := &ra.Prometheus, &ra.HTTP
	switch {
	case prom.Bad || web.Bad:
	case prom.Set && web.Set:
		at(ra.Line, "adaptive: use one source, prometheus or http, not both")
	case !prom.Set && !web.Set:
		at(ra.Line, "adaptive: needs a source: prometheus: {url: ..., query: ...} or http: {url: ...}")
	case prom.Set:
		s.Source.Kind = adaptive.Prometheus
		s.Source.URL = signalURL(&prom.URL, "adaptive.prometheus.url", line(prom.Line), true, at)
		switch q := &prom.Query; {
		case !q.Set:
			at(line(prom.Line), "adaptive.prometheus.query is required (PromQL that gives one number)")
		case q.Bad:
		case strings.TrimSpace(q.V) == "":
			at(q.Line, "adaptive.prometheus.query is empty")
		case len(q.V) > adaptive.MaxQueryLen:
			at(q.Line, "adaptive.prometheus.query must be at most %d bytes, got %d", adaptive.MaxQueryLen, len(q.V))
		default:
			s.Source.Query = q.V
		}
	default:
		s.Source.Kind = adaptive.HTTP
		s.Source.URL = signalURL(&web.URL, "adaptive.http.url", line(web.Line), false, at)
	}
	if v := &ra.Reduce; v.ok() {
		red, ok := adaptive.ParseReduce(v.V)
		switch {
		case s.Source.Kind == adaptive.HTTP:
			at(v.Line, "adaptive.reduce is only for prometheus (an http source answers one number)")
		case !ok:
			at(v.Line, "adaptive.reduce must be one of %s, got %q", reduceList(), v.V)
		}
		s.Source.Reduce = red
	}

	stepLines := compileSteps(ra, s, at)

	// The bounds default to the table's extremes, and always hold 1: the
	// factor of a signal that failed for keep_on_error.
	s.MinFactor, s.MaxFactor = 1, 1
	for _, st := range s.Steps {
		if st.Factor > 0 {
			s.MinFactor, s.MaxFactor = min(s.MinFactor, st.Factor), max(s.MaxFactor, st.Factor)
		}
	}
	boundsOK := true
	if v := &ra.MinFactor; v.ok() {
		s.MinFactor = v.V
		if !(v.V > 0 && v.V <= 1) {
			at(v.Line, "adaptive.min_factor must be > 0 and <= 1 (a failing signal returns the factor to 1), got %s", formatFloat(v.V))
			boundsOK = false
		}
	} else if ra.MinFactor.Bad {
		boundsOK = false
	}
	if v := &ra.MaxFactor; v.ok() {
		s.MaxFactor = v.V
		if !(v.V >= 1 && v.V <= adaptive.MaxFactor) {
			at(v.Line, "adaptive.max_factor must be >= 1 and <= %g (a failing signal returns the factor to 1), got %s", adaptive.MaxFactor, formatFloat(v.V))
			boundsOK = false
		}
	} else if ra.MaxFactor.Bad {
		boundsOK = false
	}
	if boundsOK {
		for i, st := range s.Steps {
			if st.Factor > 0 && (st.Factor < s.MinFactor || st.Factor > s.MaxFactor) {
				at(line(stepLines[i]), "adaptive.steps[%d].factor %s is outside min_factor..max_factor (%s..%s)",
					i, formatFloat(st.Factor), formatFloat(s.MinFactor), formatFloat(s.MaxFactor))
			}
		}
		checkFactorBounds(ra, s, r, at)
	}

	if v := &ra.Hysteresis; v.ok() {
		s.Hysteresis = v.V
		if !finite(v.V) || v.V < 0 {
			at(v.Line, "adaptive.hysteresis must be a number >= 0 (in the signal's unit), got %s", formatFloat(v.V))
		}
	}
	compileTiming(ra, s, at)
	return s
}

// compileSteps checks adaptive.steps into s.Steps and returns each step's
// line.
func compileSteps(ra *rawAdaptive, s *adaptive.Spec, at func(line int, format string, args ...any)) []int {
	st := &ra.Steps
	switch {
	case !st.Set:
		at(ra.Line, "adaptive.steps is required, such as [{below: 50, factor: 1.5}, {below: 80, factor: 1}, {factor: 0.8}]")
		return nil
	case st.Bad:
		return nil
	case len(st.V) < adaptive.MinSteps:
		at(st.Line, "adaptive.steps needs at least %d steps, got %d (a constant factor is an override or a new limit)", adaptive.MinSteps, len(st.V))
		return nil
	case len(st.V) > adaptive.MaxSteps:
		at(st.Line, "adaptive.steps must have at most %d steps, got %d", adaptive.MaxSteps, len(st.V))
		return nil
	}
	lines := make([]int, len(st.V))
	prev, prevOK := math.Inf(-1), true
	for i := range st.V {
		rs := &st.V[i]
		lines[i] = rs.Line
		step := adaptive.Step{Below: math.Inf(1)}
		if rs.Bad {
			s.Steps = append(s.Steps, step)
			prevOK = false
			continue
		}
		name := fmt.Sprintf("adaptive.steps[%d]", i)
		last := i == len(st.V)-1
		switch b := &rs.Below; {
		case last && b.Set:
			at(b.Line, "%s is the last step: it takes every value above the others and has no below", name)
		case !last && !b.Set:
			at(rs.Line, "%s.below is required (only the last step has none)", name)
			prevOK = false
		case b.Bad:
			prevOK = false
		case last:
		case !finite(b.V):
			at(b.Line, "%s.below must be a finite number, got %s", name, formatFloat(b.V))
			prevOK = false
		case prevOK && b.V <= prev:
			at(b.Line, "%s.below must be greater than the step before it (%s), got %s", name, formatFloat(prev), formatFloat(b.V))
			step.Below, prev = b.V, b.V
		default:
			step.Below, prev, prevOK = b.V, b.V, true
		}
		switch f := &rs.Factor; {
		case !f.Set:
			at(rs.Line, "%s.factor is required", name)
		case f.Bad:
		case !(f.V > 0 && f.V <= adaptive.MaxFactor):
			at(f.Line, "%s.factor must be > 0 and <= %g, got %s", name, adaptive.MaxFactor, formatFloat(f.V))
		default:
			step.Factor = f.V
		}
		s.Steps = append(s.Steps, step)
	}
	return lines
}

// checkFactorBounds checks that the rule stays a valid rule at both
// bounds: no limit above the maximum, no request costing more than the
// bucket holds.
func checkFactorBounds(ra *rawAdaptive, s *adaptive.Spec, r *limits.Rule, at func(line int, format string, args ...any)) {
	if CheckRule(r) != nil {
		return // reported already
	}
	lineOf := func(o *opt[float64]) int {
		if o.Set {
			return o.Line
		}
		return ra.Line
	}
	bound := int64(maxLimit)
	if info, ok := r.Algorithm.Info(); ok && info.MaxLimit > 0 {
		bound = min(bound, info.MaxLimit) // sliding_log's own bound
	}
	if hi := math.Floor(float64(r.Limit) * s.MaxFactor); hi > float64(bound) {
		at(lineOf(&ra.MaxFactor), "adaptive: max_factor %s makes the limit %.0f, more than %d (the bound for %s)", formatFloat(s.MaxFactor), hi, bound, r.Algorithm)
	} else if r.Algorithm.UsesBurst() && math.Floor(float64(r.Burst)*s.MaxFactor) > maxLimit {
		at(lineOf(&ra.MaxFactor), "adaptive: max_factor %s makes the burst more than %d", formatFloat(s.MaxFactor), maxLimit)
	}
	what, room := "limit", r.Limit
	if r.Algorithm.UsesBurst() {
		what, room = "burst", r.Burst
	}
	if lo := max(int64(math.Floor(float64(room)*s.MinFactor)), 1); lo < r.Cost {
		at(lineOf(&ra.MinFactor), "adaptive: min_factor %s makes the %s %d, less than the cost %d: no request could pass",
			formatFloat(s.MinFactor), what, lo, r.Cost)
	}
}

// compileTiming checks interval, timeout, cooldown, keep_on_error and
// lease_ttl, filling in their defaults.
func compileTiming(ra *rawAdaptive, s *adaptive.Spec, at func(line int, format string, args ...any)) {
	s.Interval = adaptive.DefaultInterval
	if v := &ra.Interval; v.ok() {
		s.Interval = v.V
		switch {
		case v.V < adaptive.MinInterval:
			at(v.Line, "adaptive.interval must be >= %s, got %s", FormatDuration(adaptive.MinInterval), FormatDuration(v.V))
			s.Interval = adaptive.MinInterval
		case v.V > adaptive.MaxInterval:
			at(v.Line, "adaptive.interval must be <= %s, got %s", FormatDuration(adaptive.MaxInterval), FormatDuration(v.V))
			s.Interval = adaptive.MaxInterval
		}
	}
	s.Timeout = min(adaptive.DefaultTimeout, s.Interval/2)
	if v := &ra.Timeout; v.ok() {
		s.Timeout = v.V
		switch {
		case v.V <= 0:
			at(v.Line, "adaptive.timeout must be > 0, got %s", FormatDuration(v.V))
		case v.V > s.Interval/2 || v.V > adaptive.MaxTimeout:
			at(v.Line, "adaptive.timeout must be at most half of adaptive.interval (%s) and at most %s, got %s",
				FormatDuration(s.Interval), FormatDuration(adaptive.MaxTimeout), FormatDuration(v.V))
		}
	}
	if v := &ra.Cooldown; v.ok() {
		s.Cooldown = v.V
		if v.V < 0 || v.V > adaptive.MaxCooldown {
			at(v.Line, "adaptive.cooldown must be between 0s and %s, got %s", FormatDuration(adaptive.MaxCooldown), FormatDuration(v.V))
		}
	}
	if v := &ra.KeepOnError; v.ok() {
		s.KeepOnError = v.V
		if v.V < 0 || v.V > adaptive.MaxKeepOnError {
			at(v.Line, "adaptive.keep_on_error must be between 0s and %s, got %s", FormatDuration(adaptive.MaxKeepOnError), FormatDuration(v.V))
		}
	}
	s.KeepRaiseOnError = s.KeepOnError
	if v := &ra.KeepRaise; v.ok() {
		s.KeepRaiseOnError = v.V
		if v.V < 0 || v.V > s.KeepOnError {
			at(v.Line, "adaptive.keep_raise_on_error must be between 0s and adaptive.keep_on_error (%s), got %s", FormatDuration(s.KeepOnError), FormatDuration(v.V))
		}
	}
	s.LeaseTTL = adaptive.DefaultLeaseFactor * s.Interval
	if v := &ra.LeaseTTL; v.ok() {
		s.LeaseTTL = v.V
		switch {
		case v.V < adaptive.MinLeaseFactor*s.Interval:
			at(v.Line, "adaptive.lease_ttl must be at least %d times adaptive.interval (%s), so the leader renews it in time, got %s",
				adaptive.MinLeaseFactor, FormatDuration(s.Interval), FormatDuration(v.V))
		case v.V > adaptive.MaxLeaseTTL:
			at(v.Line, "adaptive.lease_ttl must be <= %s, got %s", FormatDuration(adaptive.MaxLeaseTTL), FormatDuration(v.V))
		}
	}
}

// signalURL checks a signal source's URL. Messages never repeat the URL:
// it may hold a password. base says the URL is a Prometheus base URL,
// to which rategate appends the query path.
func signalURL(v *opt[string], path string, parentLine int, base bool, at func(line int, format string, args ...any)) string {
	switch {
	case !v.Set:
		at(parentLine, "%s is required", path)
		return ""
	case v.Bad:
		return ""
	}
	u, err := url.Parse(v.V)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		at(v.Line, "%s is not a URL: %v", path, err)
		return v.V
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		at(v.Line, "%s must start with http:// or https://, got scheme %q", path, u.Scheme)
	case u.Host == "":
		at(v.Line, "%s has no host", path)
	case u.Fragment != "" || strings.Contains(v.V, "#"):
		at(v.Line, "%s must not have a #fragment", path)
	case base && u.RawQuery != "":
		at(v.Line, "%s is the server's base URL, without a query: rategate asks <url>/api/v1/query?query=...", path)
	case base && strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/api/v1/query"):
		at(v.Line, "%s is the server's base URL: leave out /api/v1/query, rategate adds it", path)
	}
	return v.V
}

func reduceList() string {
	names := make([]string, len(adaptive.Reduces))
	for i, r := range adaptive.Reduces {
		names[i] = r.String()
	}
	return strings.Join(names, ", ")
}

// describeAdaptive writes a rule's adaptive block for -check.
func describeAdaptive(field func(label, format string, args ...any), s *adaptive.Spec) {
	field("adaptive", "factor from %s, read every %s (timeout %s) by one instance at a time (lease %s)",
		s.Source.String(), FormatDuration(s.Interval), FormatDuration(s.Timeout), FormatDuration(s.LeaseTTL))
	field("steps", "%s (hysteresis %s; within x%s..x%s; a raise at least %s after a change)", s.DescribeSteps(),
		formatFloat(s.Hysteresis), formatFloat(s.MinFactor), formatFloat(s.MaxFactor), FormatDuration(s.Cooldown))
	if s.KeepRaiseOnError < s.KeepOnError {
		field("on error", "keep the last factor %s (a factor above 1: %s) after the last good reading, then x1",
			FormatDuration(s.KeepOnError), FormatDuration(s.KeepRaiseOnError))
		return
	}
	field("on error", "keep the last factor %s after the last good reading, then x1", FormatDuration(s.KeepOnError))
}
