package etcdtest

import (
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
	"path/filepath"
	"time"
)

// CA is a certificate authority made for a test, with crypto/x509.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
	// File is the CA certificate's PEM file.
	File string
	dir  string
	n    int64
}

// NewCA makes a CA named name whose files live in dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: dir, n: 1}
	ca.File = filepath.Join(dir, name+"-ca.crt")
	if err := os.WriteFile(ca.File, ca.CertPEM, 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// Pool is a cert pool of the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issued is a certificate the CA issued, with its key, in files and in
// memory.
type Issued struct {
	CertFile, KeyFile string
	Pair              tls.Certificate
}

// CertOptions shape an issued certificate.
type CertOptions struct {
	// CommonName is the subject's common name (an etcd user with client
	// certificate auth).
	CommonName string
	// IPs are the server certificate's IP addresses (none: a client
	// certificate).
	IPs []net.IP
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// Issue makes a certificate signed by the CA, its files named after
// o.CommonName.
func (ca *CA) Issue(o CertOptions) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(o.IPs) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = o.IPs
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	base := filepath.Join(ca.dir, fmt.Sprintf("%s-%d", o.CommonName, ca.n))
	is := &Issued{CertFile: base + ".crt", KeyFile: base + ".key"}
	if err := os.WriteFile(is.CertFile, certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(is.KeyFile, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if is.Pair, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, err
	}
	return is, nil
}

// ClientTLS is a client configuration trusting roots and presenting
// cert (nil: none).
func ClientTLS(roots *x509.CertPool, cert *Issued) *tls.Config {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.Pair}
	}
	return cfg
}

// LoopbackIP returns a fresh loopback address for a cluster (members of
// one cluster share it), so a server certificate can name it.
func LoopbackIP() string { return loopbackIP() }
