package metrics

import (
	"sync/atomic"
	"time"
)

// DurationBuckets are the upper bounds, in seconds, of every duration
// histogram rategate exports. A decision normally takes tens to hundreds of
// microseconds (memory store) or a fraction of a millisecond to a few
// milliseconds (Redis on the same network), so the buckets are dense below
// 1 ms and reach past the default 50 ms store timeout.
var DurationBuckets = []float64{
	0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
}

// Histogram counts durations into fixed buckets. Observe is lock-free and
// allocation-free; a scrape reads the buckets with atomic loads, so it may
// see an observation in _count a moment before it shows in _sum.
type Histogram struct {
	bounds []int64         // upper bounds in nanoseconds, ascending
	counts []atomic.Uint64 // per bucket, not cumulative; the last one is +Inf
	sumNS  atomic.Uint64   // total observed nanoseconds
	upper  []float64       // the bounds in seconds, for the exposition
}

// NewHistogram returns a histogram with the given upper bounds in seconds
// (ascending); nil means DurationBuckets.
func NewHistogram(bounds []float64) *Histogram {
	if bounds == nil {
		bounds = DurationBuckets
	}
	h := &Histogram{
		bounds: make([]int64, len(bounds)),
		counts: make([]atomic.Uint64, len(bounds)+1),
		upper:  bounds,
	}
	for i, b := range bounds {
		h.bounds[i] = int64(b * float64(time.Second))
	}
	return h
}

// Observe records one duration. Negative durations count as zero.
func (h *Histogram) Observe(d time.Duration) {
	ns := int64(d)
	if ns < 0 {
		ns = 0
	}
	i := 0
	for i < len(h.bounds) && ns > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNS.Add(uint64(ns))
}

// snapshot returns the cumulative bucket counts (one per bound, then +Inf),
// the total count and the sum in seconds.
func (h *Histogram) snapshot(cum []uint64) ([]uint64, uint64, float64) {
	cum = cum[:0]
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
		cum = append(cum, total)
	}
	return cum, total, float64(h.sumNS.Load()) / float64(time.Second)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	return total
}
