package redisstore

import (
	"context"
	"fmt"
	"sort"

	"github.com/rategate/rategate/limits"

	"github.com/rategate/rategate/lua"
)

// The Redis store's side of leases (lease.go): one run of lua/lease.lua per
// take, return, reset or look, on the rule's key and its lease record
// (LeaseKey), which share a hash tag and so a slot. Leases are few (a take
// every few tens of milliseconds per busy key and instance), so they are
// not coalesced: each is one script run (runOnce), which on Redis Cluster
// goes to the slot's primary as a decision does, never resent once it may
// have run (a take is a commit: run twice, its first slice would be held by
// nobody). A take whose
// reply is lost (a timeout) may have leased units this instance never
// learns of: they are held until the slice's until and count as spent, the
// strict side.

// leaseArgs starts lease.lua's ARGV: now, op, code, limit, period, burst.
func leaseArgs(c *limits.Check, nowUS int64, op string) ([]any, error) {
	if !c.Algorithm.Leasable() {
		return nil, fmt.Errorf("redis store: %s cannot be leased", c.Algorithm)
	}
	return []any{nowUS, op, c.Algorithm.Code(), c.Limit, c.PeriodUS, c.Burst}, nil
}

// runLease runs lease.lua on c's key and its lease record.
func (s *Store) runLease(ctx context.Context, c *limits.Check, args []any) ([]any, error) {
	reply, err := s.runOnce(ctx, lua.LeaseScript, []string{c.Key, limits.LeaseKey(c.Key)}, args...)
	if err != nil {
		s.noteError(err)
		return nil, fmt.Errorf("redis store: lease %s %q: %w", args[1], c.Key, err)
	}
	arr, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("redis store: lease reply is %T, want array", reply)
	}
	return arr, nil
}

// leaseInts reads the first n items of a lease reply as integers.
func leaseInts(arr []any, n int) ([]int64, error) {
	if len(arr) < n {
		return nil, fmt.Errorf("redis store: lease reply has %d items, want %d", len(arr), n)
	}
	out := make([]int64, n)
	for i := range out {
		v, err := replyInt(arr[i])
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// TakeLease implements Leaser.
func (s *Store) TakeLease(ctx context.Context, t *limits.LeaseTake) (limits.LeaseGrant, error) {
	args, err := leaseArgs(&t.Check, t.NowUS, "take")
	if err != nil {
		return limits.LeaseGrant{}, err
	}
	args = append(args, t.Check.Cost, t.Want, t.ID, t.TTLUS)
	for _, id := range t.Settle {
		args = append(args, id)
	}
	arr, err := s.runLease(ctx, &t.Check, args)
	if err != nil {
		return limits.LeaseGrant{}, err
	}
	v, err := leaseInts(arr, 7)
	if err != nil || len(arr) != 7 {
		if err == nil {
			err = fmt.Errorf("redis store: lease take reply has %d items, want 7", len(arr))
		}
		return limits.LeaseGrant{}, err
	}
	return limits.LeaseGrant{Granted: v[1], NowUS: v[0], UntilUS: v[2],
		Result: limits.Result{Allowed: v[3] == 1, Remaining: v[4], ResetUS: v[5], RetryUS: v[6]}}, nil
}

// ReturnLease implements Leaser.
func (s *Store) ReturnLease(ctx context.Context, r *limits.LeaseReturn) (int64, error) {
	args, err := leaseArgs(&r.Check, r.NowUS, "return")
	if err != nil {
		return 0, err
	}
	for _, sl := range r.Slices {
		args = append(args, sl.ID, sl.Unspent)
	}
	arr, err := s.runLease(ctx, &r.Check, args)
	if err != nil {
		return 0, err
	}
	v, err := leaseInts(arr, 2)
	if err != nil {
		return 0, err
	}
	return v[1], nil
}

// ResetLease implements Leaser.
func (s *Store) ResetLease(ctx context.Context, c limits.Check, nowUS int64) error {
	args, err := leaseArgs(&c, nowUS, "reset")
	if err != nil {
		return err
	}
	_, err = s.runLease(ctx, &c, args)
	return err
}

// LookLease implements Leaser.
func (s *Store) LookLease(ctx context.Context, c limits.Check, nowUS int64) (limits.LeaseLook, error) {
	args, err := leaseArgs(&c, nowUS, "look")
	if err != nil {
		return limits.LeaseLook{}, err
	}
	arr, err := s.runLease(ctx, &c, args)
	if err != nil {
		return limits.LeaseLook{}, err
	}
	head, err := leaseInts(arr, 2)
	if err != nil {
		return limits.LeaseLook{}, err
	}
	n := int(head[1])
	if n < 0 || len(arr) != 2+3*n {
		return limits.LeaseLook{}, fmt.Errorf("redis store: lease look reply has %d items for %d slices", len(arr), n)
	}
	look := limits.LeaseLook{NowUS: head[0]}
	for i := 0; i < n; i++ {
		id, ok := arr[2+3*i].(string)
		if !ok {
			return limits.LeaseLook{}, fmt.Errorf("redis store: lease look: slice id is %T", arr[2+3*i])
		}
		g, err := replyInt(arr[3+3*i])
		if err != nil {
			return limits.LeaseLook{}, err
		}
		u, err := replyInt(arr[4+3*i])
		if err != nil {
			return limits.LeaseLook{}, err
		}
		look.Slices = append(look.Slices, limits.LeasedSlice{ID: id, Granted: g, UntilUS: u})
	}
	sort.Slice(look.Slices, func(i, j int) bool { return look.Slices[i].ID < look.Slices[j].ID })
	return look, nil
}
