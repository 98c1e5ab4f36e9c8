package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
)

// openedStore is the store rategate decides on, and the same store by its own
// type for the features only it has: exactly one of redis and memory is set.
type openedStore struct {
	limits.Store
	redis  *redisstore.Store
	memory *memstore.Store
}

// overlap is redis.coalesce.overlap_after as the store takes it: 0 (send
// at once) is a negative Overlap there, where 0 means the default.
func overlap(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// openStore connects to Redis when a URL, cluster or sentinel is configured
// (redisURL, from -redis or RATEGATE_REDIS_URL, wins over the file), else
// returns the in-memory store and says so.
func openStore(cfg *config.Config, redisURL string, starved func() bool, log zerolog.Logger) (openedStore, error) {
	rc := cfg.Redis
	o := redisstore.Options{Username: rc.Username, Password: rc.Password, Coalesce: redisstore.CoalesceOptions{
		Disabled:  !rc.Coalesce.Enabled,
		Pipelines: rc.Coalesce.Pipelines,
		MaxBatch:  rc.Coalesce.MaxBatch,
		Wait:      rc.Coalesce.Wait,
		Overlap:   overlap(rc.Coalesce.OverlapAfter),
		EvalOnly:  !rc.Functions,
	}, Starved: starved}
	tlsConf, err := redisTLS(rc.TLS)
	if err != nil {
		return openedStore{}, err
	}
	o.TLS = tlsConf
	switch {
	case redisURL != "" || rc.URL != "":
		// redis://host:port/db, or go-redis's cluster (?addr=) and
		// Sentinel (?master_name=) URL forms.
		o.URL = firstSet(redisURL, rc.URL)
	case len(rc.ClusterAddrs) > 0:
		o.ClusterAddrs = rc.ClusterAddrs
	case rc.Sentinel.Master != "":
		o.SentinelMaster, o.SentinelAddrs = rc.Sentinel.Master, rc.Sentinel.Addrs
		o.SentinelUsername, o.SentinelPassword = rc.Sentinel.Username, rc.Sentinel.Password
	default:
		log.Info().Msg("no Redis configured: using the embedded in-memory store (limits are per process; set -redis redis://host:6379/0 to share them)")
		m := memstore.New()
		m.SetMaxKeys(cfg.MemoryMaxKeys)
		return openedStore{Store: m, memory: m}, nil
	}
	store, err := redisstore.Open(o)
	if err != nil {
		return openedStore{}, err
	}
	store.SetLogger(log)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		log.Warn().Err(err).Str("store", store.Name()).Str("topology", string(store.Topology())).Str("failure_mode", cfg.FailureMode.String()).
			Msg("Redis does not answer yet; serving by failure_mode until it does")
	} else {
		// Load the scripts everywhere now, so the first decisions fit redis.timeout.
		if err := store.Warm(ctx); err != nil {
			log.Warn().Err(err).Str("store", store.Name()).Msg("could not preload the scripts; the first decisions will load them")
		}
		fcall, evalsha := store.Functions()
		log.Info().Str("store", store.Name()).Str("topology", string(store.Topology())).
			Int("servers_fcall", fcall).Int("servers_evalsha", evalsha).Msg("connected to Redis")
	}
	return openedStore{Store: store, redis: store}, nil
}

// redisTLS builds the TLS settings of redis.tls, or nil when it is off.
// Errors name the field whose file could not be used.
func redisTLS(t config.TLS) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis.tls.ca_file: no PEM certificate in %q", t.CAFile)
		}
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.cert_file/key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
