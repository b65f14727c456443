package fusebox

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and
// "localhost" and its key, and returns their paths.
func writeSelfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

func TestTLS(t *testing.T) {
	cert, key := writeSelfSigned(t)
	// The helper's own admin client speaks plaintext, so only Acquire is
	// tried here, through a TLS client.
	s := startServer(t, "--tls-cert", cert, "--tls-key", key)
	cfg, err := TLSFromFiles(cert, "", "", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, s, WithTLS(cfg))
	if err := c.Guard(context.Background(), "k", ok, Deadline(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	flush(t, c)
	if st := c.Stats(); st.Granted != 1 || st.Completed != 1 {
		t.Fatalf("stats %+v", st)
	}
	plain := newClient(t, s)
	var adm Admission
	plain.Guard(context.Background(), "k", func(ctx context.Context) error { adm, _ = AdmissionFrom(ctx); return nil })
	if !adm.FailedOpen {
		t.Fatal("a plaintext client cannot reach a TLS server")
	}
}

func TestUnavailableIsLoggedOncePerInterval(t *testing.T) {
	s := startServer(t)
	var buf bytes.Buffer
	c := newClient(t, s, WithLogger(slog.New(slog.NewTextHandler(&buf, nil))), WithLogInterval(time.Hour))
	s.stop()
	for i := 0; i < 3; i++ {
		c.Guard(context.Background(), "k", ok)
	}
	if n := strings.Count(buf.String(), "failing open"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, buf.String())
	}
	if st := c.Stats(); st.FailedOpen != 3 {
		t.Fatalf("stats %+v", st)
	}
}
