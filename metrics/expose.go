package metrics

import (
	"math"
	"runtime"
	"runtime/debug"
	rm "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/rategate/rategate/handler"
)

// ContentType is the Content-Type of WriteText's output.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// expo appends the Prometheus text format to a buffer.
type expo struct {
	b   []byte
	cum []uint64
}

func (e *expo) family(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, help...)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

// sample writes name{labels} value; labels are name, value pairs.
func (e *expo) sample(name string, v float64, labels ...string) {
	e.b = append(e.b, name...)
	e.labels(labels)
	e.b = append(e.b, ' ')
	e.b = appendFloat(e.b, v)
	e.b = append(e.b, '\n')
}

func (e *expo) labels(labels []string) {
	if len(labels) == 0 {
		return
	}
	e.b = append(e.b, '{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = append(e.b, labels[i]...)
		e.b = append(e.b, `="`...)
		e.b = appendEscaped(e.b, labels[i+1])
		e.b = append(e.b, '"')
	}
	e.b = append(e.b, '}')
}

func (e *expo) histogram(name string, h *Histogram, labels ...string) {
	var total uint64
	var sum float64
	e.cum, total, sum = h.snapshot(e.cum)
	ls := make([]string, 0, len(labels)+2)
	ls = append(ls, labels...)
	ls = append(ls, "le", "")
	for i, c := range e.cum {
		if i < len(h.upper) {
			ls[len(ls)-1] = strconv.FormatFloat(h.upper[i], 'g', -1, 64)
		} else {
			ls[len(ls)-1] = "+Inf"
		}
		e.sample(name+"_bucket", float64(c), ls...)
	}
	e.sample(name+"_sum", sum, labels...)
	e.sample(name+"_count", float64(total), labels...)
}

func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.AppendInt(b, int64(v), 10)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// appendEscaped escapes a label value: backslash, double quote, newline.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// AppendText appends every metric in the Prometheus text format to b.
func (m *Metrics) AppendText(b []byte) []byte {
	e := &expo{b: b}

	e.family("rategate_decisions_total", "counter",
		"Verdicts of matching rules, one per rule per /auth request: allowed, limited (the rule denied), shadow_limited (a shadow rule would have denied; not enforced).")
	names, rules := m.ruleNames()
	for _, n := range names {
		rs := rules[n]
		e.sample("rategate_decisions_total", float64(rs.allowed.Load()), "rule", n, "decision", "allowed")
		e.sample("rategate_decisions_total", float64(rs.limited.Load()), "rule", n, "decision", "limited")
		e.sample("rategate_decisions_total", float64(rs.shadowLimited.Load()), "rule", n, "decision", "shadow_limited")
	}
	if o := &m.other; o.allowed.Load()+o.limited.Load()+o.shadowLimited.Load() > 0 {
		e.sample("rategate_decisions_total", float64(o.allowed.Load()), "rule", OtherRule, "decision", "allowed")
		e.sample("rategate_decisions_total", float64(o.limited.Load()), "rule", OtherRule, "decision", "limited")
		e.sample("rategate_decisions_total", float64(o.shadowLimited.Load()), "rule", OtherRule, "decision", "shadow_limited")
	}

	e.family("rategate_deny_cache_decisions_total", "counter",
		"Denials answered from the local deny cache without asking the store, by the rule whose cached denial answered; also counted in rategate_decisions_total as limited.")
	for _, n := range names {
		e.sample("rategate_deny_cache_decisions_total", float64(rules[n].denyCached.Load()), "rule", n)
	}
	if o := &m.other; o.denyCached.Load() > 0 {
		e.sample("rategate_deny_cache_decisions_total", float64(o.denyCached.Load()), "rule", OtherRule)
	}
	var dcEntries, dcEvicted float64
	if dc := m.denyCache.Load(); dc != nil {
		dcEntries, dcEvicted = float64(dc.Len()), float64(dc.Evictions())
	}
	e.family("rategate_deny_cache_entries", "gauge",
		"Store denials held in the local deny cache (0 when the cache is off).")
	e.sample("rategate_deny_cache_entries", dcEntries)
	e.family("rategate_deny_cache_evictions_total", "counter",
		"Unexpired deny cache entries dropped because the cache was full; a steady rate means the cache is too small for the identities being denied.")
	e.sample("rategate_deny_cache_evictions_total", dcEvicted)

	e.family("rategate_requests_total", "counter",
		"/auth requests by outcome: allowed, limited, no_match (no rule matched), bad_request (400), unavailable (store failed, answered by failure_mode without a decision).")
	for o := range numOutcomes {
		e.sample("rategate_requests_total", float64(m.requests[o].Load()), "outcome", outcomeNames[o])
	}
	e.family("rategate_request_duration_seconds", "histogram",
		"Time to answer one /auth request, from reading its headers to writing the answer, by outcome.")
	for o := range numOutcomes {
		e.histogram("rategate_request_duration_seconds", m.requestDur[o], "outcome", outcomeNames[o])
	}

	e.family("rategate_bad_requests_total", "counter",
		"/auth requests answered 400, by reason: missing_uri, invalid_ip, invalid_cost.")
	for r := range m.badRequests {
		e.sample("rategate_bad_requests_total", float64(m.badRequests[r].Load()), "reason", handler.BadRequestReason(r).String())
	}

	e.family("rategate_failure_mode_decisions_total", "counter",
		"/auth requests answered by failure_mode because the shared store failed: allow (204), deny (503), local (decided by the per-process fallback).")
	for i := range numModes {
		e.sample("rategate_failure_mode_decisions_total", float64(m.failureMode[i].Load()), "mode", modeNames[i])
	}
	e.family("rategate_failure_mode_rule_decisions_total", "counter",
		"The same answers counted once per matching rule, by rule and mode: which limits went unenforced (allow, deny) or were enforced per process (local).")
	for _, n := range names {
		for i := range numModes {
			e.sample("rategate_failure_mode_rule_decisions_total", float64(rules[n].failure[i].Load()), "rule", n, "mode", modeNames[i])
		}
	}

	e.family("rategate_store_duration_seconds", "histogram",
		"Time of one store call by op: decide (one /auth decision, every matching rule), peek, reset, ping, raw.")
	for op := range numOps {
		e.histogram("rategate_store_duration_seconds", m.storeDur[op], "op", opNames[op])
	}
	e.family("rategate_store_errors_total", "counter",
		"Failed store calls by op and kind: timeout, connection, script, cluster, other.")
	for op := range numOps {
		for k := range numKinds {
			e.sample("rategate_store_errors_total", float64(m.storeErrors[op][k].Load()), "op", opNames[op], "kind", kindNames[k])
		}
	}

	e.family("rategate_config_reloads_total", "counter",
		"Config reloads (SIGHUP, POST /v1/reload, file watch) by result: success, error (the running rules were kept).")
	e.sample("rategate_config_reloads_total", float64(m.reloads[0].Load()), "result", "success")
	e.sample("rategate_config_reloads_total", float64(m.reloads[1].Load()), "result", "error")
	e.family("rategate_config_last_reload_successful", "gauge", "1 when the last reload succeeded (or none was tried), 0 when it failed.")
	e.sample("rategate_config_last_reload_successful", b2f(m.lastReloadOK.Load()))
	e.family("rategate_config_last_reload_success_timestamp_seconds", "gauge", "Unix time of the last successful config load.")
	e.sample("rategate_config_last_reload_success_timestamp_seconds", float64(m.lastReloadTime.Load()))

	infos := *m.ruleInfo.Load()
	e.family("rategate_rules", "gauge", "Rules in force.")
	e.sample("rategate_rules", float64(len(infos)))
	e.family("rategate_rule_limit", "gauge", "Effective limit of each rule (file value with any runtime override).")
	for _, r := range infos {
		e.sample("rategate_rule_limit", float64(r.Limit), "rule", r.Name)
	}
	e.family("rategate_rule_period_seconds", "gauge", "Effective period of each rule.")
	for _, r := range infos {
		e.sample("rategate_rule_period_seconds", r.Period.Seconds(), "rule", r.Name)
	}
	e.family("rategate_rule_burst", "gauge", "Effective burst of each rule (equal to the limit for window algorithms).")
	for _, r := range infos {
		e.sample("rategate_rule_burst", float64(r.Burst), "rule", r.Name)
	}
	e.family("rategate_rule_shadow", "gauge", "1 for a shadow rule (evaluated, never denies).")
	for _, r := range infos {
		e.sample("rategate_rule_shadow", b2f(r.Shadow), "rule", r.Name)
	}
	e.family("rategate_rule_override_active", "gauge", "1 while a runtime override changes the rule.")
	for _, r := range infos {
		e.sample("rategate_rule_override_active", b2f(r.Override), "rule", r.Name)
	}
	e.family("rategate_override_sync_errors_total", "counter", "Failed reads of the runtime overrides from the store.")
	e.sample("rategate_override_sync_errors_total", float64(m.overrideSyncErrors.Load()))
	e.family("rategate_top_publish_errors_total", "counter", "Failed publications of this instance's top-denied sketch to the store.")
	e.sample("rategate_top_publish_errors_total", float64(m.topPublishErrors.Load()))

	if m.redisPolled.Load() {
		ri := RedisInfo{}
		if p := m.redis.Load(); p != nil {
			ri = *p
		}
		e.family("rategate_redis_up", "gauge", "1 when the last INFO (every few seconds) succeeded.")
		e.sample("rategate_redis_up", b2f(ri.Up))
		e.family("rategate_redis_used_memory_bytes", "gauge", "Redis used_memory (summed over cluster masters).")
		e.sample("rategate_redis_used_memory_bytes", float64(ri.UsedMemory))
		e.family("rategate_redis_maxmemory_bytes", "gauge", "Redis maxmemory; 0 = no limit.")
		e.sample("rategate_redis_maxmemory_bytes", float64(ri.MaxMemory))
		e.family("rategate_redis_connected_clients", "gauge", "Redis connected_clients.")
		e.sample("rategate_redis_connected_clients", float64(ri.ConnectedClients))
		e.family("rategate_redis_ops_per_second", "gauge", "Redis instantaneous_ops_per_sec.")
		e.sample("rategate_redis_ops_per_second", float64(ri.OpsPerSec))
		e.family("rategate_redis_evicted_keys_total", "counter", "Redis evicted_keys: keys dropped for maxmemory. Rate-limit state must never be evicted.")
		e.sample("rategate_redis_evicted_keys_total", float64(ri.EvictedKeys))
		e.family("rategate_redis_expired_keys_total", "counter", "Redis expired_keys.")
		e.sample("rategate_redis_expired_keys_total", float64(ri.ExpiredKeys))
	}

	if p := m.gauges.Load(); p != nil {
		for _, g := range *p {
			e.family(g.name, g.kind, g.help)
			e.sample(g.name, g.f())
		}
	}

	m.appendRuntime(e)
	return e.b
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// runtimeSamples are the runtime/metrics read at each scrape.
var runtimeSamples = []struct {
	key, name, typ, help string
}{
	{"/sched/goroutines:goroutines", "go_goroutines", "gauge", "Number of goroutines that currently exist."},
	{"/memory/classes/heap/objects:bytes", "go_memstats_heap_alloc_bytes", "gauge", "Bytes of allocated heap objects."},
	{"/memory/classes/total:bytes", "go_memstats_sys_bytes", "gauge", "Bytes of memory obtained from the OS."},
	{"/gc/heap/goal:bytes", "go_gc_heap_goal_bytes", "gauge", "Heap size target for the end of the GC cycle."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", "counter", "Completed GC cycles."},
	{"/gc/heap/allocs:bytes", "go_memstats_alloc_bytes_total", "counter", "Cumulative bytes allocated for heap objects."},
	{"/sched/gomaxprocs:threads", "go_sched_gomaxprocs_threads", "gauge", "GOMAXPROCS."},
}

func (m *Metrics) appendRuntime(e *expo) {
	samples := make([]rm.Sample, len(runtimeSamples))
	for i, s := range runtimeSamples {
		samples[i].Name = s.key
	}
	rm.Read(samples)
	for i, s := range runtimeSamples {
		var v float64
		switch samples[i].Value.Kind() {
		case rm.KindUint64:
			v = float64(samples[i].Value.Uint64())
		case rm.KindFloat64:
			v = samples[i].Value.Float64()
		default:
			continue // not supported by this Go version
		}
		e.family(s.name, s.typ, s.help)
		e.sample(s.name, v)
	}
	e.family("go_threads", "gauge", "Number of OS threads created.")
	e.sample("go_threads", float64(pprof.Lookup("threadcreate").Count()))
	e.family("go_info", "gauge", "Information about the Go environment.")
	e.sample("go_info", 1, "version", runtime.Version())

	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	e.family("rategate_build_info", "gauge", "Always 1; the labels say which rategate runs.")
	e.sample("rategate_build_info", 1, "version", version, "goversion", runtime.Version())
	e.family("rategate_start_time_seconds", "gauge", "Unix time the process started serving.")
	e.sample("rategate_start_time_seconds", float64(m.start.UnixNano())/float64(time.Second))

	appendProcess(e)
}
