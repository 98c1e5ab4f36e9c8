package handler

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// countingSampler is a zerolog.Sampler for lines an attack can multiply
// (denials, shadow verdicts): at most burst lines per period get through,
// and the lines it drops are counted, never lost without a trace. At the end
// of every period in which it dropped any, one line says how many:
//
//	{"level":"info","suppressed":44,"period_ms":1000,"message":"44 denial lines suppressed in the last 1s (at most 10 per 1s are logged)"}
//
// Sample is the hot path: two or three atomic operations and a monotonic
// clock read, no allocation, no lock. The summary is written by a timer,
// armed when a period drops its first line, so it comes even when the
// flood stops.
type countingSampler struct {
	burst  int64
	period time.Duration
	// what names the lines in the summary: "denial", "shadow".
	what string
	// log receives the summary; it is not sampled.
	log   zerolog.Logger
	level zerolog.Level
	// elapsed is the time since the sampler was made; a test replaces it.
	elapsed func() time.Duration

	window  atomic.Int64 // index of the current period
	n       atomic.Int64 // lines seen in the current period
	dropped atomic.Int64 // lines dropped since the last summary
	timer   *time.Timer
}

func newCountingSampler(log zerolog.Logger, level zerolog.Level, what string, burst int64, period time.Duration) *countingSampler {
	base := time.Now()
	s := &countingSampler{
		burst: burst, period: period, what: what, log: log, level: level,
		elapsed: func() time.Duration { return time.Since(base) },
	}
	s.timer = time.AfterFunc(time.Hour, s.flush)
	s.timer.Stop()
	return s
}

// Sample implements zerolog.Sampler. zerolog asks it only for lines whose
// level is enabled.
func (s *countingSampler) Sample(zerolog.Level) bool {
	now := s.elapsed()
	w := int64(now / s.period)
	if cur := s.window.Load(); w != cur && s.window.CompareAndSwap(cur, w) {
		s.n.Store(0)
	}
	if s.n.Add(1) <= s.burst {
		return true
	}
	if s.dropped.Add(1) == 1 {
		// The first line dropped since the last summary: report at the end
		// of this period.
		s.timer.Reset(time.Duration(w+1)*s.period - now)
	}
	return false
}

// flush writes the summary of the lines dropped since the last one.
func (s *countingSampler) flush() {
	d := s.dropped.Swap(0)
	if d == 0 {
		return
	}
	per := s.period.String()
	s.log.WithLevel(s.level).
		Int64("suppressed", d).
		Int64("period_ms", s.period.Milliseconds()).
		Msg(strconv.FormatInt(d, 10) + " " + s.what + " lines suppressed in the last " + per +
			" (at most " + strconv.FormatInt(s.burst, 10) + " per " + per + " are logged)")
}
