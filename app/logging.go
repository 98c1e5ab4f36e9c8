package app

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// RedisLogger routes go-redis's own messages (failed dials, pool events)
// into the log as sampled warnings, instead of one unstructured stderr line
// per failed request while Redis is down. Install it with redis.SetLogger.
type RedisLogger struct{ log zerolog.Logger }

// NewRedisLogger returns a RedisLogger writing at most one line every 10 s.
func NewRedisLogger(log zerolog.Logger) RedisLogger {
	return RedisLogger{log.Sample(&zerolog.BurstSampler{Burst: 1, Period: 10 * time.Second})}
}

// Printf implements go-redis's logging interface.
func (l RedisLogger) Printf(_ context.Context, format string, args ...any) {
	l.log.Warn().Str("component", "go-redis").Msgf(format, args...)
}

// acceptLogger reports a listener's failed accepts (handler.LingerListener
// pauses and tries again): at most one error line every 10 s, saying what
// to change.
func acceptLogger(log zerolog.Logger, listener string) func(error) {
	sampled := log.Sample(&zerolog.BurstSampler{Burst: 1, Period: 10 * time.Second})
	return func(err error) {
		sampled.Error().Err(err).Str("listener", listener).
			Msg("cannot accept connections (out of file descriptors or memory): new clients wait until open connections close; raise the open-files limit (ulimit -n, LimitNOFILE) above the connection cap")
	}
}
