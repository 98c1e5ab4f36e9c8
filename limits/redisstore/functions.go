package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/lua"
)

// This file decides with Redis Functions where a server allows it.
//
// EVALSHA runs a script's whole top level on every call: every function
// definition of decide.lua is executed again before the decision starts.
// FCALL runs only the function, the definitions having run once, at FUNCTION
// LOAD (docs/algorithms.md has the measured difference). So each server gets
// rategate's function library (lua.Library: decide and refund, the same
// code as the scripts, under a name that changes with any source) with
// FUNCTION LOAD REPLACE, at Warm and again whenever it answers that it does
// not have the function: restarted without persistence, FUNCTION FLUSH, a
// new primary that never had it. A server that cannot run functions (Redis
// older than 7.0: FCALL is an unknown command; an ACL that forbids FCALL or
// FUNCTION LOAD: NOPERM) is decided with EVALSHA from then on, and the log
// says so once. None of these replies ran anything, so the call is sent
// again without risk of running twice.

// functions is one server's choice between FCALL of the library and
// EVALSHA of the script. The zero mode is FCALL.
type functions struct {
	lib lua.FunctionLibrary
	// eval is set once the server was found unable to run functions (or
	// the store was told not to use them).
	eval atomic.Bool
	// loadMu serialises loads: runners that all found the function missing
	// load it once, not once each.
	loadMu sync.Mutex
	loads  atomic.Int64 // libraries loaded
	// fallback is told, once, why the server is decided with EVALSHA.
	fallback func(err error)
	once     sync.Once
}

func newFunctions(evalOnly bool, fallback func(error)) *functions {
	f := &functions{lib: lua.Library(), fallback: fallback}
	f.eval.Store(evalOnly)
	return f
}

// loader is what loading the library needs from a go-redis client.
type loader interface {
	FunctionLoadReplace(ctx context.Context, code string) *redis.StringCmd
}

// decide queues one decision on pipe: FCALL of the library's decide, or
// EVALSHA of script.
func (f *functions) decide(ctx context.Context, pipe redis.Pipeliner, script *redis.Script, keys []string, args []any) *redis.Cmd {
	if f.eval.Load() {
		return script.EvalSha(ctx, pipe, keys, args...)
	}
	return pipe.FCall(ctx, f.lib.Decide, keys, args...)
}

// load puts the library on the server c reaches. A server that cannot
// take it is switched to EVALSHA; load then returns nil, since deciding can
// go on. Other errors (the server is unreachable) are returned.
func (f *functions) load(ctx context.Context, c loader) error {
	if f.eval.Load() {
		return nil
	}
	f.loadMu.Lock()
	defer f.loadMu.Unlock()
	err := c.FunctionLoadReplace(ctx, f.lib.Source).Err()
	switch {
	case err == nil:
		f.loads.Add(1)
		return nil
	case functionsUnavailable(err):
		f.useEval(err)
		return nil
	}
	return err
}

// useEval switches the server to EVALSHA for good and says why, once.
func (f *functions) useEval(err error) {
	f.eval.Store(true)
	f.once.Do(func() {
		if f.fallback != nil {
			f.fallback(err)
		}
	})
}

// isFCall reports whether cmd is an FCALL.
func isFCall(cmd *redis.Cmd) bool {
	a := cmd.Args()
	if len(a) == 0 {
		return false
	}
	s, _ := a[0].(string)
	return strings.EqualFold(s, "fcall")
}

// isNoFunction reports the reply of an FCALL whose function the server
// does not have.
func isNoFunction(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "Function not found")
}

// functionsUnavailable reports a reply that says the server will not run
// functions for rategate: an unknown command (Redis < 7.0), or one the
// ACL forbids.
func functionsUnavailable(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "NOPERM") ||
		strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "ERR unknown subcommand")
}
