//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// This file finds the metric names a PromQL expression reads, so that
// e2e/deploy_test.go can check every name used by deploy/grafana/ and
// deploy/prometheus/ against what a running rategate exports. It is a
// lexer, not a parser: the real Prometheus of that test parses and
// evaluates every expression too.

// promqlKeywords are identifiers that are never metric names: binary and
// set operators, modifiers and the aggregation operators (which may be
// followed by "by (...)" before their parenthesis).
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true,
	"inf": true, "nan": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true,
	"stddev": true, "stdvar": true, "count": true, "count_values": true,
	"bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

// grafanaVars are Grafana's template variables: $__rate_interval and the
// like become a duration, $name and ${name} (used inside label values) a
// plain word.
var (
	grafanaIntervals = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)
	grafanaVars      = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

// expandGrafana replaces Grafana's variables with values that make the
// expression plain PromQL.
func expandGrafana(expr string) string {
	expr = grafanaIntervals.ReplaceAllString(expr, "1m")
	return grafanaVars.ReplaceAllString(expr, ".*")
}

// promqlMetricNames returns the metric names expr selects, sorted and
// without repeats. It fails on what it cannot resolve (a regular
// expression on __name__) and on unbalanced brackets or strings.
func promqlMetricNames(expr string) ([]string, error) {
	var (
		names    = map[string]bool{}
		i        int
		braces   int // inside {...}: label matchers
		brackets int // inside [...]: ranges and subqueries
	)
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(j int) int {
		for j < len(expr) && strings.IndexByte(" \t\r\n", expr[j]) >= 0 {
			j++
		}
		return j
	}
	// readString returns the value of the string literal at j and the index after it.
	readString := func(j int) (string, int, error) {
		q := expr[j]
		var b strings.Builder
		for k := j + 1; k < len(expr); k++ {
			c := expr[k]
			if c == '\\' && q != '`' && k+1 < len(expr) {
				k++
				b.WriteByte(expr[k])
				continue
			}
			if c == q {
				return b.String(), k + 1, nil
			}
			b.WriteByte(c)
		}
		return "", 0, fmt.Errorf("unterminated string at offset %d", j)
	}
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			_, next, err := readString(i)
			if err != nil {
				return nil, err
			}
			i = next
		case c == '{':
			braces++
			i++
		case c == '}':
			braces--
			if braces < 0 {
				return nil, fmt.Errorf("unbalanced } at offset %d", i)
			}
			i++
		case c == '[':
			brackets++
			i++
		case c == ']':
			brackets--
			if brackets < 0 {
				return nil, fmt.Errorf("unbalanced ] at offset %d", i)
			}
			i++
		case c >= '0' && c <= '9' || c == '.':
			// A number or a duration (5m, 1d12h, 1e3, 0x1f): one token.
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			next := skipSpace(j)
			switch {
			case brackets > 0:
				// a duration inside [...] (already consumed as a number) or a
				// subquery step; nothing here names a metric
			case braces > 0:
				// A label matcher: name op "value". Only __name__ names a metric.
				if word == "__name__" {
					op := next
					for op < len(expr) && strings.IndexByte("=!~", expr[op]) >= 0 {
						op++
					}
					operator := expr[next:op]
					v := skipSpace(op)
					if v >= len(expr) || strings.IndexByte("\"'`", expr[v]) < 0 {
						return nil, fmt.Errorf("__name__ matcher without a string at offset %d", i)
					}
					val, after, err := readString(v)
					if err != nil {
						return nil, err
					}
					if operator != "=" {
						return nil, fmt.Errorf("__name__%s%q: cannot tell which metrics that selects", operator, val)
					}
					names[val] = true
					j = after
				}
			case labelListKeywords[strings.ToLower(word)] && next < len(expr) && expr[next] == '(':
				end := strings.IndexByte(expr[next:], ')')
				if end < 0 {
					return nil, fmt.Errorf("unclosed label list after %s", word)
				}
				j = next + end + 1
			case promqlKeywords[strings.ToLower(word)]:
			case next < len(expr) && expr[next] == '(':
				// a function call
			default:
				names[word] = true
			}
			i = j
		default:
			i++
		}
	}
	if braces != 0 || brackets != 0 {
		return nil, fmt.Errorf("unbalanced brackets")
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// labelValuesQuery matches Grafana's label_values(selector, label) variable
// query; the selector is PromQL.
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

func TestPromQLMetricNames(t *testing.T) {
	cases := []struct {
		expr string
		want string
	}{
		{`sum by (rule, decision) (rate(rategate_decisions_total{rule=~"$rule"}[$__rate_interval]))`, "rategate_decisions_total"},
		{`histogram_quantile(0.99, sum by (instance, le) (rate(x_seconds_bucket{outcome=~"a|b"}[5m])))`, "x_seconds_bucket"},
		{`a / on (instance) group_left(version) b`, "a b"},
		{`a / ignoring(kind) group_right c`, "a c"},
		{`{__name__="foo", job="bar"}`, "foo"},
		{`up{job="rategate"} == bool 0 offset 5m`, "up"},
		{`count_values("version", build_info)`, "build_info"},
		{`max_over_time(x[1d:5m]) > 1e3 and y < 0x1f`, "x y"},
		{`"not_a_metric" + z`, "z"},
		{`time() - start_time_seconds`, "start_time_seconds"},
		{`sum(rate(x_total[5m])) by (job) / sum without (instance, pod) (y_total)`, "x_total y_total"},
		{"x # a comment naming y\n + w", "w x"},
		{`topk(5, z) unless on(job) absent(q)`, "q z"},
		{`rule:recorded:rate5m > 0.2`, "rule:recorded:rate5m"},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, "m"},
		{`sum by (le) (rate(h_bucket{l="}"}[5m]))`, "h_bucket"},
	}
	for _, c := range cases {
		got, err := promqlMetricNames(expandGrafana(c.expr))
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s: got %q, want %q", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`{__name__=~"rategate_.*"}`, `sum(x{a="b"`, `rate(x[5m)`, `x{a="b}`} {
		if got, err := promqlMetricNames(bad); err == nil {
			t.Errorf("%s: got %q and no error", bad, got)
		}
	}
}
