package policy

import (
	"context"
	"encoding/json"
	"time"

	"github.com/rategate/rategate/adaptive"
	"github.com/rategate/rategate/config"
)

// RunAdaptive keeps the adaptive limits going until ctx ends: it reads the
// adaptive records (on every announcement and every SyncEvery) and applies
// them, and runs one controller per adaptive rule of the file, which
// evaluates the rule's signal whenever this instance holds the rule's
// lease. A reload that adds, removes or changes an adaptive block is
// followed within SyncEvery. On return every lease this instance holds is
// released, so another instance takes over at once.
func (m *Manager) RunAdaptive(ctx context.Context) {
	ctls := map[string]*ruleController{}
	defer func() {
		for _, c := range ctls {
			c.stop()
		}
	}()
	t := time.NewTicker(m.syncEvery)
	defer t.Stop()
	var watch <-chan struct{}
	watching, failing := false, false
	for {
		specs := m.adaptiveSpecs()
		if len(specs) > 0 && !watching {
			watch, watching = m.adaptive.store.Watch(ctx), true
		}
		m.reconcile(ctx, ctls, specs)
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		err := m.syncAdaptive(sctx)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			m.log.Warn().Err(err).Msg("cannot read the adaptive factors; keeping the ones in force")
			failing = true
		case err == nil && failing:
			m.log.Info().Msg("adaptive factors readable again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-t.C:
		}
	}
}

// adaptiveSpecs returns the file's adaptive rules: name -> spec.
func (m *Manager) adaptiveSpecs() map[string]*adaptive.Spec {
	m.mu.Lock()
	defer m.mu.Unlock()
	specs := map[string]*adaptive.Spec{}
	for _, r := range m.file {
		if r.Adaptive != nil {
			specs[r.Name] = r.Adaptive
		}
	}
	return specs
}

// reconcile starts a controller for each new or changed adaptive rule and
// stops those of rules that are gone or changed.
func (m *Manager) reconcile(ctx context.Context, ctls map[string]*ruleController, specs map[string]*adaptive.Spec) {
	for name, c := range ctls {
		if s, ok := specs[name]; !ok || s.Signature() != c.spec.Signature() {
			c.stop()
			delete(ctls, name)
		}
	}
	for name, s := range specs {
		if _, ok := ctls[name]; !ok {
			ctls[name] = m.startController(ctx, name, s)
		}
	}
}

// ruleController evaluates one rule's signal while this instance holds the
// rule's lease.
type ruleController struct {
	m      *Manager
	name   string
	spec   *adaptive.Spec
	stats  *adaptiveStats
	cancel context.CancelFunc
	done   chan struct{}

	// Owned by the controller's goroutine.
	leader   bool
	written  bool // a record was written since this instance took the lease
	state    adaptive.State
	leaseErr bool // "cannot take the lease" was logged
	writeErr bool // "cannot write the record" was logged
}

func (m *Manager) startController(ctx context.Context, name string, spec *adaptive.Spec) *ruleController {
	cctx, cancel := context.WithCancel(ctx)
	c := &ruleController{m: m, name: name, spec: spec, stats: m.adaptive.statsOf(name), cancel: cancel,
		done: make(chan struct{}), state: adaptive.Initial()}
	go c.run(cctx)
	return c
}

// stop ends the controller and waits for it (it releases its lease).
func (c *ruleController) stop() {
	c.cancel()
	<-c.done
}

func (c *ruleController) run(ctx context.Context) {
	defer close(c.done)
	// Config validation keeps the interval >= 1s; a hand-built spec must
	// not make the ticker panic or spin.
	t := time.NewTicker(max(c.spec.Interval, 10*time.Millisecond))
	defer t.Stop()
	for {
		c.evaluate(ctx)
		select {
		case <-ctx.Done():
			c.resign()
			return
		case <-t.C:
		}
	}
}

// storeTimeout bounds each lease and record call, so that renewing the
// lease, reading the signal and writing the record fit in one interval.
func storeTimeout(s *adaptive.Spec) time.Duration {
	return min(time.Second, max(s.Interval/4, 5*time.Millisecond))
}

// evaluate is one round: take or renew the lease; if held, read the
// signal, decide, and write the decision (only while still holding the
// lease: a leader that stalled past its lease writes nothing).
func (c *ruleController) evaluate(ctx context.Context) {
	store, id := c.m.adaptive.store, c.m.adaptive.instance
	lctx, cancel := context.WithTimeout(ctx, storeTimeout(c.spec))
	held, err := store.Lead(lctx, c.name, id, c.spec.LeaseTTL)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		if !c.leaseErr {
			c.m.log.Warn().Err(err).Str("rule", c.name).
				Msg("cannot take or renew the adaptive lease: this instance does not evaluate the rule's signal until the store answers")
			c.leaseErr = true
		}
		c.stepDown("the shared store does not answer")
		return
	}
	if c.leaseErr {
		c.m.log.Info().Str("rule", c.name).Msg("the adaptive lease can be taken again")
		c.leaseErr = false
	}
	if !held {
		c.stepDown("another instance holds the lease")
		return
	}
	if !c.leader {
		c.takeOver(ctx)
	}

	rctx, cancel := context.WithTimeout(ctx, c.spec.Timeout)
	v, rerr := c.m.adaptive.signals.Read(rctx, &c.spec.Source)
	cancel()
	if ctx.Err() != nil {
		return
	}
	rerr = adaptive.Checked(v, rerr)
	now := c.m.now()
	next := c.spec.Next(c.state, now, v, rerr)
	c.stats.evaluations.Add(1)
	detail := ""
	if rerr != nil {
		c.stats.errors[adaptive.ReasonOf(rerr)%adaptive.NumReasons].Add(1)
		detail = rerr.Error()
	}
	c.report(c.state, next, rerr)

	rec, err := json.Marshal(recordOf(next, id, now, detail))
	if err != nil { // cannot happen: every float in a state is finite
		c.m.log.Error().Err(err).Str("rule", c.name).Msg("cannot encode the adaptive record")
		return
	}
	announce := !c.written || next.Factor != c.state.Factor || next.FailingSince.IsZero() != c.state.FailingSince.IsZero()
	wctx, cancel := context.WithTimeout(ctx, storeTimeout(c.spec))
	ok, err := store.Write(wctx, c.name, id, string(rec), announce)
	cancel()
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		if !c.writeErr {
			c.m.log.Warn().Err(err).Str("rule", c.name).Msg("cannot write the adaptive factor: the other instances keep the last one")
			c.writeErr = true
		}
		c.state = next
		return
	case c.writeErr:
		c.m.log.Info().Str("rule", c.name).Msg("the adaptive factor can be written again")
		c.writeErr = false
	}
	if !ok {
		c.stepDown("another instance took the lease over")
		return
	}
	c.written, c.state = true, next
}

// takeOver starts this instance's term as the rule's evaluator, from the
// state the previous one wrote (its step, its last change, its last good
// reading), so hysteresis, cooldown and keep_on_error carry over.
func (c *ruleController) takeOver(ctx context.Context) {
	c.state = adaptive.Initial()
	lctx, cancel := context.WithTimeout(ctx, storeTimeout(c.spec))
	raw, err := c.m.adaptive.store.Load(lctx)
	cancel()
	var rec AdaptiveRecord
	found := false
	if err == nil {
		found = raw[c.name] != "" && json.Unmarshal([]byte(raw[c.name]), &rec) == nil
	} else { // the copy the manager read last
		c.m.mu.Lock()
		rec, found = c.m.adaptive.recs[c.name]
		c.m.mu.Unlock()
	}
	if found {
		c.state = stateOf(rec, c.spec)
	}
	c.leader, c.written = true, false
	c.m.setLeading(c.name, true)
	ev := c.m.log.Info().Str("rule", c.name).Str("factor", describeFactor(c.state.Factor))
	if rec.SetBy != "" {
		ev = ev.Str("previous", rec.SetBy)
	}
	ev.Msg("this instance now evaluates the rule's adaptive signal")
}

// stepDown ends this instance's term, if it had one.
func (c *ruleController) stepDown(why string) {
	if !c.leader {
		return
	}
	c.leader, c.written = false, false
	c.m.setLeading(c.name, false)
	c.m.log.Info().Str("rule", c.name).Str("why", why).Msg("this instance no longer evaluates the rule's adaptive signal")
}

// resign releases the lease on the way out, so another instance takes
// over without waiting for it to expire.
func (c *ruleController) resign() {
	if !c.leader {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.m.adaptive.store.Release(ctx, c.name, c.m.adaptive.instance)
	c.stepDown("stopped (shutdown, or the rule's adaptive block changed)")
}

// report logs what one evaluation changed: a failure once when it starts
// (or its reason changes) and once when it ends, and each change of the
// factor. An evaluation that changed nothing logs nothing.
func (c *ruleController) report(prev, next adaptive.State, err error) {
	wasFailing, isFailing := !prev.FailingSince.IsZero(), !next.FailingSince.IsZero()
	switch {
	case isFailing && (!wasFailing || prev.Failing != next.Failing):
		c.m.log.Warn().Str("rule", c.name).Str("reason", next.Failing.String()).Str("error", err.Error()).
			Str("factor", describeFactor(next.Factor)).Str("keep_on_error", config.FormatDuration(c.spec.KeepOnError)).
			Msg("adaptive signal failing: the factor is kept for keep_on_error after the last good reading, then it is x1")
	case wasFailing && !isFailing:
		c.m.log.Info().Str("rule", c.name).Float64("signal", next.Signal).
			Str("failed_for", config.FormatDuration(next.SignalAt.Sub(prev.FailingSince).Round(time.Millisecond))).
			Msg("adaptive signal readable again")
	}
	if next.Factor == prev.Factor {
		return
	}
	if isFailing {
		c.m.log.Warn().Str("rule", c.name).Str("from", describeFactor(prev.Factor)).Str("to", describeFactor(next.Factor)).
			Str("reason", next.Failing.String()).Msg("adaptive signal failed for longer than keep_on_error: factor back to x1")
		return
	}
	c.m.log.Info().Str("rule", c.name).Str("from", describeFactor(prev.Factor)).Str("to", describeFactor(next.Factor)).
		Float64("signal", next.Signal).Int("step", next.Step).Msg("adaptive factor changed")
}
