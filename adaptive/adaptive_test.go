package adaptive

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// cpu is the table of the docs: CPU below 50% -> 1.5x, below 80% -> 1x,
// above -> 0.8x, with hysteresis 5 (percentage points).
func cpu() *Spec {
	return &Spec{
		Steps:       []Step{{Below: 50, Factor: 1.5}, {Below: 80, Factor: 1}, {Below: math.Inf(1), Factor: 0.8}},
		Hysteresis:  5,
		MinFactor:   0.8,
		MaxFactor:   1.5,
		Interval:    time.Second,
		Timeout:     500 * time.Millisecond,
		Cooldown:    10 * time.Second,
		KeepOnError: 30 * time.Second,
		// KeepRaiseOnError 30s too: TestNextKeepRaise shortens it.
		KeepRaiseOnError: 30 * time.Second,
		LeaseTTL:         3 * time.Second,
	}
}

func TestStepForHysteresis(t *testing.T) {
	s := cpu()
	for _, c := range []struct {
		v        float64
		cur      int
		want     int
		becauses string
	}{
		{10, -1, 0, "no current step: the plain table"},
		{49.99, -1, 0, ""},
		{50, -1, 1, "below is strict: 50 is not below 50"},
		{79.9, -1, 1, ""},
		{80, -1, 2, ""},
		{1e300, -1, 2, "huge values are the last step"},
		{-1e300, -1, 0, "negative values are the first step"},
		{54.9, 0, 0, "at step 0, up to 50+5 stays"},
		{55, 0, 1, "55 is past the edge by the hysteresis: leaves"},
		{95, 0, 2, "a jump lands on the step the value is in"},
		{45, 1, 1, "at step 1, down to 50-5 stays"},
		{44.99, 1, 0, ""},
		{84.99, 1, 1, "and up to 80+5"},
		{85, 1, 2, ""},
		{75, 2, 2, "at the last step, down to 80-5 stays"},
		{74.99, 2, 1, ""},
		{0, 2, 0, ""},
		{60, 7, 1, "a step out of range (the table shrank) is none"},
	} {
		if got := s.StepFor(c.v, c.cur); got != c.want {
			t.Errorf("StepFor(%g, %d) = %d, want %d (%s)", c.v, c.cur, got, c.want, c.becauses)
		}
	}
}

var errTimeout = &Error{Reason: Timeout, Detail: "no answer within 500ms"}

// TestNextTimeline: one evaluation per row, the clock advanced by the row's
// seconds first.
func TestNextTimeline(t *testing.T) {
	s := cpu()
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	st := Initial()
	for i, row := range []struct {
		advance     float64 // seconds
		v           float64
		err         error
		wantFactor  float64
		wantStep    int
		wantFailing string // "" = not failing
	}{
		{0, 30, nil, 1.5, 0, ""},              // the first decision is immediate
		{1, 52, nil, 1.5, 0, ""},              // inside the hysteresis
		{1, 60, nil, 1, 1, ""},                // step 1: a lowering, at once (the last change was 2s ago)
		{1, 30, nil, 1, 1, ""},                // a raise 1s after a change: held (cooldown 10s)
		{9, 30, nil, 1.5, 0, ""},              // 10s after the change: moves
		{1, 90, nil, 0.8, 2, ""},              // overloaded 1s after a raise: lowered at once
		{1, 0, errTimeout, 0.8, 2, "timeout"}, // failing: keeps the factor
		{1, math.NaN(), nil, 0.8, 2, "nan"},   // NaN is a failure, whatever err says
		{1, math.Inf(1), nil, 0.8, 2, "infinite"},
		{26, 0, errTimeout, 0.8, 2, "timeout"}, // t=42: 29s after the last good reading (t=13)
		{1, 0, errTimeout, 1, -1, "timeout"},   // t=43, 30s: back to 1, at once
		{10, 0, errTimeout, 1, -1, "timeout"},  // stays 1
		{1, 90, nil, 0.8, 2, ""},               // good again: lowered at once
		{1, 10, nil, 0.8, 2, ""},               // a raise 1s after that change: held
		{9, 10, nil, 1.5, 0, ""},               // 10s after it: moves
	} {
		now = now.Add(time.Duration(row.advance * float64(time.Second)))
		st = s.Next(st, now, row.v, row.err)
		failing := ""
		if !st.FailingSince.IsZero() {
			failing = st.Failing.String()
		}
		if st.Factor != row.wantFactor || st.Step != row.wantStep || failing != row.wantFailing {
			t.Fatalf("row %d (t=%v, v=%g, err=%v): factor %g step %d failing %q; want %g %d %q",
				i, now.Sub(t0), row.v, row.err, st.Factor, st.Step, failing, row.wantFactor, row.wantStep, row.wantFailing)
		}
	}
}

// TestNextKeepOnErrorZero: keep_on_error 0 gives up on the first failure;
// a failure before any good reading keeps the factor it was seeded with
// for keep_on_error from the failure's start.
func TestNextKeepOnError(t *testing.T) {
	s := cpu()
	now := time.Unix(1_700_000_000, 0)
	s.KeepOnError = 0
	st := s.Next(Initial(), now, 90, nil)
	if st.Factor != 0.8 {
		t.Fatalf("factor %g", st.Factor)
	}
	if st = s.Next(st, now.Add(time.Second), 0, errTimeout); st.Factor != 1 || st.Step != -1 {
		t.Errorf("keep_on_error 0: factor %g step %d after one failure, want 1 -1", st.Factor, st.Step)
	}

	s.KeepOnError = 5 * time.Second
	seeded := State{Factor: 1.5, Step: 0} // from a record without a reading
	st = s.Next(seeded, now, 0, errTimeout)
	if st.Factor != 1.5 {
		t.Errorf("first failure of a seeded state: factor %g, want 1.5 kept", st.Factor)
	}
	if st = s.Next(st, now.Add(5*time.Second), 0, errTimeout); st.Factor != 1 {
		t.Errorf("5s into the failure: factor %g, want 1", st.Factor)
	}
}

// TestNextKeepRaise: a factor above 1 is given up on after
// keep_raise_on_error, one below 1 is kept for keep_on_error: a signal that
// fails under load does not leave clients a raise granted while idle.
func TestNextKeepRaise(t *testing.T) {
	s := cpu()
	s.KeepRaiseOnError = 2 * time.Second
	now := time.Unix(1_700_000_000, 0)
	raised := s.Next(Initial(), now, 10, nil)
	lowered := s.Next(Initial(), now, 90, nil)
	if raised.Factor != 1.5 || lowered.Factor != 0.8 {
		t.Fatalf("factors %g %g", raised.Factor, lowered.Factor)
	}
	later := now.Add(2 * time.Second)
	if st := s.Next(s.Next(raised, now.Add(time.Second), 0, errTimeout), later, 0, errTimeout); st.Factor != 1 {
		t.Errorf("a raise failing for 2s: factor %g, want 1", st.Factor)
	}
	if st := s.Next(s.Next(lowered, now.Add(time.Second), 0, errTimeout), later, 0, errTimeout); st.Factor != 0.8 {
		t.Errorf("a reduction failing for 2s: factor %g, want 0.8 kept (keep_on_error 30s)", st.Factor)
	}
}

// TestNextClampsTheTable: a factor outside the bounds is never produced,
// even from a table that breaks them (config validation forbids it).
func TestNextClampsTheTable(t *testing.T) {
	s := cpu()
	s.Steps[0].Factor = 1e9
	st := s.Next(Initial(), time.Unix(0, 0), 1, nil)
	if st.Factor != 1.5 {
		t.Errorf("factor %g, want max_factor 1.5", st.Factor)
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -3, 0} {
		if got := s.Clamp(f); got != 1 {
			t.Errorf("Clamp(%g) = %g, want 1", f, got)
		}
	}
	if got := s.Clamp(0.1); got != 0.8 {
		t.Errorf("Clamp(0.1) = %g, want min_factor 0.8", got)
	}
}

// TestNextRandomized checks invariants over random signals, failures and
// clocks: the factor is always 1 or within the bounds; a raise never
// comes sooner than the cooldown after the last change unless it is a
// reset to 1 (a failing signal); and a
// signal wandering inside the hysteresis band around an edge changes the
// factor at most once.
func TestNextRandomized(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := cpu()
	for run := 0; run < 200; run++ {
		now := time.Unix(1_700_000_000, 0)
		st := Initial()
		var lastChange time.Time
		for i := 0; i < 300; i++ {
			now = now.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
			var err error
			v := rng.Float64()*120 - 10
			switch rng.IntN(10) {
			case 0:
				err = errTimeout
			case 1:
				v = math.NaN()
			}
			prev := st
			st = s.Next(st, now, v, err)
			if st.Factor != 1 && (st.Factor < s.MinFactor || st.Factor > s.MaxFactor) {
				t.Fatalf("factor %g out of bounds", st.Factor)
			}
			if st.Factor != prev.Factor {
				if st.Factor > prev.Factor && st.Step != -1 && !lastChange.IsZero() && now.Sub(lastChange) < s.Cooldown {
					t.Fatalf("a raise %v after the last change, cooldown %v", now.Sub(lastChange), s.Cooldown)
				}
				lastChange = now
			}
		}
	}

	// Around the 80 edge, inside 75..85: one change at most.
	st := s.Next(Initial(), time.Unix(0, 0), 70, nil)
	now := time.Unix(0, 0)
	changes := 0
	for i := 0; i < 1000; i++ {
		now = now.Add(time.Minute) // far past the cooldown every time
		prev := st.Factor
		st = s.Next(st, now, 75+rng.Float64()*9.99, nil)
		if st.Factor != prev {
			changes++
		}
	}
	if changes > 1 {
		t.Errorf("a signal inside the hysteresis band changed the factor %d times", changes)
	}
}

func TestReasons(t *testing.T) {
	for r := Reason(0); r < NumReasons; r++ {
		got, ok := ParseReason(r.String())
		if !ok || got != r {
			t.Errorf("ParseReason(%q) = %v, %v", r, got, ok)
		}
	}
	if ReasonOf(errors.New("plain")) != Unreachable {
		t.Error("an error without a reason is unreachable")
	}
	if ReasonOf(&Error{Reason: SeveralSeries}) != SeveralSeries {
		t.Error("ReasonOf lost the reason")
	}
}

func TestDescribe(t *testing.T) {
	s := cpu()
	if got, want := s.DescribeSteps(), "below 50: x1.5; below 80: x1; above: x0.8"; got != want {
		t.Errorf("DescribeSteps = %q, want %q", got, want)
	}
	src := Source{Kind: Prometheus, URL: "http://u:secret@prom:9090", Query: "up", Reduce: Max}
	if got := src.String(); got != `prometheus http://u:xxxxx@prom:9090 query "up" (reduce max)` {
		t.Errorf("Source.String = %q", got)
	}
}
