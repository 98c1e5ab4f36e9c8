// Package top keeps the identities denied most, per rule: a Space-Saving
// sketch per rule and minute in fixed memory, merged across instances
// through a shared store when there is one (the Redis store's).
package top

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/internal/tick"
)

// The top-denied sketch: for each rule, one Space-Saving summary per minute
// of the last TopMinutes minutes, each holding at most TopSlots identities.
// Space-Saving (Metwally et al., 2005) keeps the heavy hitters of a stream in
// fixed memory: an identity denied more than 1/TopSlots of a minute's
// denials is always listed, and its count is over-estimated by at most the
// reported error. Memory is fixed — TopSlots × TopMinutes entries per rule,
// for at most TopMaxRules rules — whatever the traffic.
const (
	// TopMinutes is how far back GET /v1/top can look.
	TopMinutes = 5
	// TopSlots is the number of identities each minute's summary tracks.
	TopSlots = 64
	// TopMaxRules bounds the rules with a summary; denials of further rule
	// names are not tracked.
	TopMaxRules = 256
	// TopPublishEvery is how often an instance publishes its summaries to
	// Redis for the others to merge.
	TopPublishEvery = 2 * time.Second
)

// topEntry is one tracked identity in a minute's summary.
type topEntry struct {
	Key   string `json:"k"`
	Count int64  `json:"c"`
	// Err bounds the over-estimate of Count (Space-Saving's epsilon).
	Err int64 `json:"e"`
}

// minuteSketch is one minute's Space-Saving summary.
type minuteSketch struct {
	minute  int64 // unix minute
	entries map[string]*topEntry
}

type ruleSketch struct {
	mu      sync.Mutex
	minutes [TopMinutes]minuteSketch
}

// Shared is where instances publish their summaries and read the others'.
// The Redis store implements it (hashes <prefix>:top:<rule>, field =
// instance).
type Shared interface {
	// Publish stores one instance's summaries of one rule, kept for ttl.
	Publish(ctx context.Context, rule, instance string, summary []byte, ttl time.Duration) error
	// Load returns every instance's summaries of one rule.
	Load(ctx context.Context, rule string) (map[string]string, error)
	// Rules lists the rules some instance published, at most max.
	Rules(ctx context.Context, max int) ([]string, error)
	// Remove drops the summaries of the given instances of one rule.
	Remove(ctx context.Context, rule string, instances []string) error
}

// Top tracks the identities denied most, per rule. It is safe for
// concurrent use. With a shared store (SetShared) every instance publishes
// its summaries and Query merges the whole fleet's.
type Top struct {
	now      func() time.Time
	mu       sync.Mutex // serializes adding rules
	rules    atomic.Pointer[map[string]*ruleSketch]
	instance string

	shared Shared // nil: this instance only
	// pruned is when Publish last removed the summaries of instances
	// that stopped publishing (unix seconds).
	pruned atomic.Int64
}

// topKeep is how long a published summary is kept: its minutes and one more.
const topKeep = (TopMinutes + 1) * time.Minute

// topPruneEvery is how often an instance removes, while it publishes, the
// summaries of instances that stopped: the rule's hash lives on as long as
// any instance publishes, and each restarted instance is a new name. Each
// prune reads every instance's summary of every rule, so the fleet's cost
// grows with the square of its size: once per topKeep, from a random
// point in the first (New), a stopped instance's summary stays at most
// twice topKeep.
const topPruneEvery = topKeep

// New returns an empty sketch.
func New() *Top {
	host, _ := os.Hostname()
	t := &Top{
		now:      time.Now,
		instance: fmt.Sprintf("%s:%d:%d", host, os.Getpid(), time.Now().UnixNano()),
	}
	empty := map[string]*ruleSketch{}
	t.rules.Store(&empty)
	t.pruned.Store(time.Now().Unix() - rand.Int64N(int64(topPruneEvery/time.Second)))
	return t
}

// SetShared makes Top publish to and merge from s. Call before use.
func (t *Top) SetShared(s Shared) { t.shared = s }

// IsShared reports whether Query merges every instance's denials.
func (t *Top) IsShared() bool { return t.shared != nil }

func (t *Top) sketch(rule string, create bool) *ruleSketch {
	if s := (*t.rules.Load())[rule]; s != nil || !create {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	if s := old[rule]; s != nil {
		return s
	}
	if len(old) >= TopMaxRules {
		return nil
	}
	next := make(map[string]*ruleSketch, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	s := &ruleSketch{}
	next[rule] = s
	t.rules.Store(&next)
	return s
}

// Record counts one denial of key (a store key, which names the identity)
// by rule.
func (t *Top) Record(rule, key string) {
	s := t.sketch(rule, true)
	if s == nil {
		return
	}
	minute := t.now().Unix() / 60
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &s.minutes[minute%TopMinutes]
	if m.minute != minute || m.entries == nil {
		m.minute = minute
		m.entries = make(map[string]*topEntry, TopSlots)
	}
	if e := m.entries[key]; e != nil {
		e.Count++
		return
	}
	if len(m.entries) < TopSlots {
		m.entries[key] = &topEntry{Key: key, Count: 1}
		return
	}
	// Replace the smallest: the newcomer inherits its count as error.
	var min *topEntry
	for _, e := range m.entries {
		if min == nil || e.Count < min.Count {
			min = e
		}
	}
	delete(m.entries, min.Key)
	m.entries[key] = &topEntry{Key: key, Count: min.Count + 1, Err: min.Count}
}

// minuteSummary is one minute's summary as published.
type minuteSummary struct {
	Minute  int64      `json:"m"`
	Entries []topEntry `json:"e"`
}

// published is one instance's summaries of one rule in Redis.
type published struct {
	At      int64           `json:"at"`
	Minutes []minuteSummary `json:"minutes"`
}

// local returns this instance's summaries of rule for minutes >= from.
func (t *Top) local(rule string, from int64) []minuteSummary {
	s := t.sketch(rule, false)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []minuteSummary
	for i := range s.minutes {
		m := &s.minutes[i]
		if m.entries == nil || m.minute < from || len(m.entries) == 0 {
			continue
		}
		ms := minuteSummary{Minute: m.minute, Entries: make([]topEntry, 0, len(m.entries))}
		for _, e := range m.entries {
			ms.Entries = append(ms.Entries, *e)
		}
		out = append(out, ms)
	}
	return out
}

// ruleNames returns the rules with a summary.
func (t *Top) ruleNames() []string {
	rules := *t.rules.Load()
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Publish hands this instance's summaries of the last TopMinutes to the
// shared store, kept TopMinutes+1 minutes. A no-op without one.
func (t *Top) Publish(ctx context.Context) error {
	if t.shared == nil {
		return nil
	}
	now := t.now()
	from := now.Unix()/60 - TopMinutes + 1
	var firstErr error
	for _, rule := range t.ruleNames() {
		mins := t.local(rule, from)
		if len(mins) == 0 {
			continue
		}
		b, err := json.Marshal(published{At: now.Unix(), Minutes: mins})
		if err != nil {
			return err
		}
		if err := t.shared.Publish(ctx, rule, t.instance, b, topKeep); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("publish the top-denied summary of rule %q: %w", rule, err)
		}
	}
	if last := t.pruned.Load(); now.Unix()-last >= int64(topPruneEvery/time.Second) && t.pruned.CompareAndSwap(last, now.Unix()) {
		if err := t.prune(ctx, now); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// prune removes, from the rules this instance publishes, the summaries
// published last more than topKeep ago (or unreadable): their instances
// have stopped.
func (t *Top) prune(ctx context.Context, now time.Time) error {
	for _, rule := range t.ruleNames() {
		m, err := t.shared.Load(ctx, rule)
		if err != nil {
			return fmt.Errorf("read the top-denied summaries of rule %q: %w", rule, err)
		}
		var gone []string
		for inst, raw := range m {
			if inst != t.instance && stale(raw, now) {
				gone = append(gone, inst)
			}
		}
		if len(gone) == 0 {
			continue
		}
		if err := t.shared.Remove(ctx, rule, gone); err != nil {
			return fmt.Errorf("remove %d stopped instances' top-denied summaries of rule %q: %w", len(gone), rule, err)
		}
	}
	return nil
}

// stale reports whether a published summary is older than topKeep, or
// unreadable.
func stale(raw string, now time.Time) bool {
	var p struct {
		At int64 `json:"at"`
	}
	return json.Unmarshal([]byte(raw), &p) != nil || outdated(p.At, now)
}

// outdated reports whether a summary published at (unix seconds) is past
// topKeep.
func outdated(at int64, now time.Time) bool { return now.Unix()-at > int64(topKeep/time.Second) }

// RunPublisher publishes every TopPublishEvery until ctx ends; failed
// publications are reported to failed.
func (t *Top) RunPublisher(ctx context.Context, failed func()) {
	if t.shared == nil {
		return
	}
	tick.Every(ctx, TopPublishEvery, func() {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := t.Publish(pctx); err != nil && failed != nil {
			failed()
		}
		cancel()
	})
}

// Denied is one identity in a top list.
type Denied struct {
	// Identity is the rule's key parts as they appear in the store key,
	// e.g. "203.0.113.7" or "alice|/login" (values escaped; long
	// identities are a "#" and a hash).
	Identity string `json:"identity"`
	Key      string `json:"key"`
	// Denied is the (over-)estimated number of denials; the true number is
	// between Denied-MaxError and Denied.
	Denied   int64 `json:"denied"`
	MaxError int64 `json:"max_error"`
	// Blocked is true while an identity override blocks the identity
	// (set by the admin API, which knows the overrides).
	Blocked bool `json:"blocked,omitempty"`
}

// TopList is one rule's list in GET /v1/top.
type TopList struct {
	Rule string   `json:"rule"`
	Top  []Denied `json:"top"`
}

// TopView is GET /v1/top.
type TopView struct {
	Minutes int `json:"minutes"`
	// Scope is "fleet" (merged across every instance through Redis) or
	// "instance" (this process only: memory store).
	Scope string `json:"scope"`
	// Instances is how many instances contributed.
	Instances int       `json:"instances"`
	Rules     []TopList `json:"rules"`
}

// Query returns the n identities denied most by each of rules (all rules
// with denials when empty) over the last minutes (1..TopMinutes), merged
// across instances when shared.
func (t *Top) Query(ctx context.Context, rules []string, minutes, n int) (TopView, error) {
	minutes = min(max(minutes, 1), TopMinutes)
	now := t.now()
	from := now.Unix()/60 - int64(minutes) + 1
	v := TopView{Minutes: minutes, Scope: "instance", Instances: 1}
	if t.shared != nil {
		v.Scope = "fleet"
	}
	instances := map[string]bool{t.instance: true}
	var remote map[string]map[string]string
	if t.shared != nil {
		if len(rules) == 0 {
			// Rules denied elsewhere but not here.
			found, err := t.shared.Rules(ctx, 10*TopMaxRules)
			if err != nil {
				return TopView{}, err
			}
			rules = union(t.ruleNames(), found)
		}
		remote = map[string]map[string]string{}
		for _, r := range rules {
			m, err := t.shared.Load(ctx, r)
			if err != nil {
				return TopView{}, fmt.Errorf("read the top-denied summaries of rule %q: %w", r, err)
			}
			remote[r] = m
		}
	} else if len(rules) == 0 {
		rules = t.ruleNames()
	}
	for _, rule := range rules {
		sum := map[string]*topEntry{}
		add := func(mins []minuteSummary) {
			for _, ms := range mins {
				if ms.Minute < from {
					continue
				}
				for _, e := range ms.Entries {
					acc := sum[e.Key]
					if acc == nil {
						acc = &topEntry{Key: e.Key}
						sum[e.Key] = acc
					}
					acc.Count += e.Count
					acc.Err += e.Err
				}
			}
		}
		add(t.local(rule, from))
		for inst, raw := range remote[rule] {
			if inst == t.instance {
				continue // our live summary is fresher than what we published
			}
			var p published
			if json.Unmarshal([]byte(raw), &p) != nil || outdated(p.At, now) {
				continue
			}
			instances[inst] = true
			add(p.Minutes)
		}
		list := make([]Denied, 0, len(sum))
		for _, e := range sum {
			list = append(list, Denied{Identity: identityOf(rule, e.Key), Key: e.Key, Denied: e.Count, MaxError: e.Err})
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].Denied != list[j].Denied {
				return list[i].Denied > list[j].Denied
			}
			return list[i].Key < list[j].Key
		})
		if n > 0 && len(list) > n {
			list = list[:n]
		}
		v.Rules = append(v.Rules, TopList{Rule: rule, Top: list})
	}
	v.Instances = len(instances)
	return v, nil
}

func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string(nil), a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// identityOf extracts the identity from a key "<prefix>:{<rule>:<identity>}:<sfx>".
func identityOf(rule, key string) string {
	open := strings.Index(key, "{"+rule+":")
	end := strings.LastIndex(key, "}:")
	if open < 0 || end < open {
		return key
	}
	return key[open+len(rule)+2 : end]
}

// MinutesParam parses ?minutes=, default TopMinutes.
func MinutesParam(s string) (int, error) {
	if s == "" {
		return TopMinutes, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > TopMinutes {
		return 0, fmt.Errorf("minutes: must be a whole number from 1 to %d, got %q", TopMinutes, s)
	}
	return n, nil
}
