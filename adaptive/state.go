package adaptive

import (
	"math"
	"time"
)

// State is what the evaluating instance knows between two evaluations. It
// is what the shared record holds, so an instance that takes the lease
// over continues from it: the same step for the hysteresis, the same last
// change for the cooldown, the same last good reading for keep_on_error.
type State struct {
	// Factor is the factor in force: 1 before the first decision and after
	// a failing signal was given up on.
	Factor float64
	// Step is the index of Factor's step in Spec.Steps; -1 for none (the
	// factor 1 of the start or of a reset).
	Step int
	// Signal is the last good reading, taken at SignalAt (zero: never).
	Signal   float64
	SignalAt time.Time
	// ChangedAt is when Factor last changed (zero: never), for Cooldown.
	ChangedAt time.Time
	// Failing is the reason of the failure in progress since FailingSince;
	// meaningless while FailingSince is zero.
	Failing      Reason
	FailingSince time.Time
}

// Initial is the state before any evaluation: factor 1, no step.
func Initial() State { return State{Factor: 1, Step: -1} }

// Next returns the state after one evaluation at now that read v, or
// failed with err.
//
// A good reading selects a step (StepFor, with hysteresis); the factor
// moves to it, but for a raise while the last change is less than
// Cooldown ago, which a later reading makes. A lowering is never held
// back: the cooldown damps flapping up, and a raise the signal no longer
// supports (the backend overloaded just after it) must not outlive that
// reading, which every client could time from RateLimit-Policy. A failed
// reading keeps the factor until
// KeepOnError (KeepRaiseOnError for a factor above 1) has passed since the
// last good reading, then the factor is 1 (at once, whatever the
// cooldown: it is the safe value). NaN and infinite values are failures
// even when err is nil.
func (s *Spec) Next(st State, now time.Time, v float64, err error) State {
	if err = Checked(v, err); err != nil {
		if st.FailingSince.IsZero() {
			st.FailingSince = now
		}
		st.Failing = ReasonOf(err)
		since := st.SignalAt
		if since.IsZero() {
			since = st.FailingSince
		}
		keep := s.KeepOnError
		if st.Factor > 1 {
			keep = min(keep, s.KeepRaiseOnError)
		}
		if now.Sub(since) >= keep && (st.Factor != 1 || st.Step != -1) {
			if st.Factor != 1 {
				st.ChangedAt = now
			}
			st.Factor, st.Step = 1, -1
		}
		return st
	}
	st.Failing, st.FailingSince = 0, time.Time{}
	st.Signal, st.SignalAt = v, now
	target := s.StepFor(v, st.Step)
	if target == st.Step {
		return st
	}
	f := s.Clamp(s.Steps[target].Factor)
	if f == st.Factor {
		st.Step = target // same factor: nothing changes for anyone
		return st
	}
	if f > st.Factor && !st.ChangedAt.IsZero() && now.Sub(st.ChangedAt) < s.Cooldown {
		return st // a raise waits: a later reading moves it
	}
	st.Step, st.Factor, st.ChangedAt = target, f, now
	return st
}

// Checked returns err, or for a value that is NaN or infinite the error
// Next would see in its place, so the caller counts and logs what Next
// decides on.
func Checked(v float64, err error) error {
	switch {
	case err != nil:
		return err
	case math.IsNaN(v):
		return &Error{Reason: NaN, Detail: "the value is NaN"}
	case math.IsInf(v, 0):
		return &Error{Reason: Infinite, Detail: "the value is infinite"}
	}
	return nil
}
