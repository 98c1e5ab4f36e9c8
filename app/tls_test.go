package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// writePEM writes one PEM block to dir/name and returns the path.
func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testPKI makes a CA and a certificate for 127.0.0.1 signed by it, used both
// as redis-server's certificate and as rategate's client certificate.
func testPKI(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rategate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER),
		writePEM(t, dir, "cert.pem", "CERTIFICATE", der),
		writePEM(t, dir, "key.pem", "EC PRIVATE KEY", keyDER)
}

// startTLSRedis runs redis-server with only a TLS port that requires client
// certificates, and stops it with the test.
func startTLSRedis(t *testing.T, caFile, certFile, keyFile string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH: %s", testredis.InstallHint)
	}
	port := testredis.FreePort(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("TLS redis-server did not listen on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisTLSFromConfig(t *testing.T) {
	caFile, certFile, keyFile := testPKI(t)
	addr := startTLSRedis(t, caFile, certFile, keyFile)
	yaml := fmt.Sprintf(`redis:
  url: redis://%s/0
  tls:
    enabled: true
    ca_file: %s
    cert_file: %s
    key_file: %s
rules:
  - name: per-ip
    key: [ip]
    algorithm: gcra
    limit: 2
    period: 1h
`, addr, caFile, certFile, keyFile)
	cfg, err := config.Parse("tls.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	store, err := openStore(cfg, "", nil, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		t.Fatalf("ping over TLS: %v", err)
	}
	l := limits.NewLimiter(store, cfg.Redis.KeyPrefix, cfg.Rules)
	var d limits.Decision
	admitted := 0
	for i := 0; i < 3; i++ {
		if err := l.Decide(ctx, &limits.Request{IP: []byte("192.0.2.1")}, &d); err != nil {
			t.Fatalf("decide over TLS: %v", err)
		}
		if d.Admitted {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d of 3 over TLS, want 2", admitted)
	}

	// Without the client certificate the server refuses the handshake.
	cfg.Redis.TLS.CertFile, cfg.Redis.TLS.KeyFile = "", ""
	bare, err := openStore(cfg, "", nil, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if err := bare.Ping(ctx); err == nil {
		t.Fatal("ping without a client certificate succeeded against tls-auth-clients yes")
	}
}

func TestRedisTLSErrorsNameTheField(t *testing.T) {
	if _, err := redisTLS(config.TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}); err == nil || !strings.HasPrefix(err.Error(), "redis.tls.ca_file:") {
		t.Fatalf("missing CA file: %v", err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	if _, err := redisTLS(config.TLS{Enabled: true, CAFile: notPEM}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("non-PEM CA file: %v", err)
	}
	if _, err := redisTLS(config.TLS{Enabled: true, CertFile: notPEM, KeyFile: notPEM}); err == nil || !strings.HasPrefix(err.Error(), "redis.tls.cert_file/key_file:") {
		t.Fatalf("bad key pair: %v", err)
	}
	if c, err := redisTLS(config.TLS{}); c != nil || err != nil {
		t.Fatalf("disabled TLS gave %v, %v", c, err)
	}
	if c, _ := redisTLS(config.TLS{Enabled: true}); c == nil || c.MinVersion != tls.VersionTLS12 {
		t.Fatalf("enabled TLS without files: %+v", c)
	}
}
