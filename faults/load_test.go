package faults

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// sample is one /auth answer seen by the load generator.
type sample struct {
	at     time.Duration // when the request was sent, since the load began
	took   time.Duration // until the whole answer was read
	status int
	mark   string // X-RateLimit-Status
	err    error  // no answer within 2s: a hang
}

// normal reports an answer Redis decided.
func (s sample) normal() bool { return s.err == nil && s.status == 204 && s.mark == "" }

// load asks /load from a few workers, each pausing between requests so the
// two cores of a CI machine are not saturated: the answer times then show
// rategate's waiting, not CPU queueing.
type load struct {
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	samples []sample
}

const (
	loadWorkers = 4
	loadPause   = 2 * time.Millisecond
)

func startLoad(g *gate) *load {
	l := &load{start: time.Now(), stop: make(chan struct{})}
	for w := range loadWorkers {
		ip := "192.0.2." + strconv.Itoa(10+w)
		l.wg.Go(func() {
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for {
				select {
				case <-l.stop:
					return
				case <-time.After(loadPause):
				}
				req.Reset()
				resp.Reset()
				req.SetRequestURI("http://" + g.addr + "/auth")
				req.Header.Set("X-Original-URI", "/load")
				req.Header.Set("X-Real-IP", ip)
				begin := time.Now()
				err := g.client.DoTimeout(req, resp, 2*time.Second)
				s := sample{at: begin.Sub(l.start), took: time.Since(begin), err: err}
				if err == nil {
					s.status = resp.StatusCode()
					s.mark = string(resp.Header.Peek("X-RateLimit-Status"))
				}
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// now is the time since the load began.
func (l *load) now() time.Duration { return time.Since(l.start) }

// finish stops the workers and returns every sample in sending order.
func (l *load) finish() []sample {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.SortFunc(l.samples, func(a, b sample) int { return int(a.at - b.at) })
	return l.samples
}

// waitNormal polls until an answer sent after from was decided by Redis, and
// returns when that answer was sent; ok is false after within.
func (l *load) waitNormal(from, within time.Duration) (at time.Duration, ok bool) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, s := range l.samples {
			if s.at >= from && s.normal() {
				l.mu.Unlock()
				return s.at, true
			}
		}
		l.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	return 0, false
}

// between returns the samples sent in [from, to).
func between(samples []sample, from, to time.Duration) []sample {
	var out []sample
	for _, s := range samples {
		if s.at >= from && s.at < to {
			out = append(out, s)
		}
	}
	return out
}

// stats summarizes answer times.
type stats struct {
	n             int
	p50, p99, max time.Duration
}

func statsOf(samples []sample) stats {
	if len(samples) == 0 {
		return stats{}
	}
	d := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i] = s.took
	}
	slices.Sort(d)
	return stats{n: len(d), p50: d[len(d)/2], p99: d[(len(d)*99)/100], max: d[len(d)-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", s.n, s.p50.Round(time.Microsecond), s.p99.Round(time.Microsecond), s.max.Round(time.Microsecond))
}
