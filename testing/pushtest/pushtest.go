// Package pushtest is a local Web Push endpoint for tests: a push
// service's receiving end that checks each push's VAPID JWT (RFC 8292:
// ES256, aud the endpoint's origin, exp in the future) and decrypts its
// body (RFC 8291 aes128gcm) with a subscription's keys it made itself —
// what a browser and its push service do, with no public push service.
//
//	r := pushtest.NewReceiver(t)
//	// subscribe r.Endpoint with r.P256dh and r.Auth, push, then:
//	p := r.Wait(t, 1)[0] // p.Payload is the decrypted message
package pushtest

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Push is one push the receiver took.
type Push struct {
	// Payload is the decrypted message.
	Payload []byte
	// Header is the request's header (TTL, Urgency, Topic…).
	Header http.Header
	// Claims are the VAPID JWT's claims (aud, exp, sub).
	Claims map[string]any
	// VAPIDKey is the k= of the Authorization header: the application
	// server's public key, base64url.
	VAPIDKey string
}

// Receiver is a local push endpoint for one subscription.
type Receiver struct {
	// Endpoint is the subscription's endpoint URL (http://127.0.0.1).
	Endpoint string
	// P256dh and Auth are the subscription's keys, base64url without
	// padding, as a browser gives them.
	P256dh, Auth string

	srv    *httptest.Server
	key    *ecdh.PrivateKey
	secret []byte
	got    chan struct{} // cap 1: a push arrived

	mu     sync.Mutex // guards the fields below
	status int        // the answer to pushes (201 unless SetStatus)
	pushes []Push
	errs   []error
}

// NewReceiver starts a receiver, closed when the test ends.
func NewReceiver(t testing.TB) *Receiver {
	t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	r := &Receiver{key: key, secret: secret, status: http.StatusCreated, got: make(chan struct{}, 1),
		P256dh: base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()),
		Auth:   base64.RawURLEncoding.EncodeToString(secret)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.Endpoint = r.srv.URL + "/push/" + base64.RawURLEncoding.EncodeToString(secret[:6])
	t.Cleanup(r.srv.Close)
	return r
}

// Close stops the receiver (a push to it then fails to connect).
func (r *Receiver) Close() { r.srv.Close() }

// SetStatus sets the status later pushes are answered with (after they
// are checked and counted).
func (r *Receiver) SetStatus(code int) {
	r.mu.Lock()
	r.status = code
	r.mu.Unlock()
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	p, err := r.check(req, body)
	r.mu.Lock()
	status := r.status
	if err != nil {
		r.errs = append(r.errs, err)
		status = http.StatusBadRequest
	} else {
		r.pushes = append(r.pushes, p)
	}
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	w.WriteHeader(status)
}

// check verifies the request's VAPID JWT and decrypts its body.
func (r *Receiver) check(req *http.Request, body []byte) (Push, error) {
	if req.Method != http.MethodPost {
		return Push{}, fmt.Errorf("method %s, want POST", req.Method)
	}
	if ce := req.Header.Get("Content-Encoding"); ce != "aes128gcm" {
		return Push{}, fmt.Errorf("header Content-Encoding %q, want aes128gcm", ce)
	}
	if req.Header.Get("TTL") == "" {
		return Push{}, errors.New("no TTL header (RFC 8030 needs one)")
	}
	claims, k, err := checkVAPID(req.Header.Get("Authorization"), "http://"+req.Host)
	if err != nil {
		return Push{}, err
	}
	payload, err := Decrypt(r.key, r.secret, body)
	if err != nil {
		return Push{}, err
	}
	return Push{Payload: payload, Header: req.Header.Clone(), Claims: claims, VAPIDKey: k}, nil
}

// checkVAPID verifies an Authorization header "vapid t=JWT, k=KEY":
// the JWT's ES256 signature by KEY, aud == origin, exp in the future
// and at most 24 h away, a sub.
func checkVAPID(h, origin string) (map[string]any, string, error) {
	rest, ok := strings.CutPrefix(h, "vapid ")
	if !ok {
		return nil, "", fmt.Errorf("header Authorization %q: want vapid t=…, k=…", h)
	}
	var tok, k string
	for _, part := range strings.Split(rest, ",") {
		part = strings.TrimSpace(part)
		if v, ok := strings.CutPrefix(part, "t="); ok {
			tok = v
		} else if v, ok := strings.CutPrefix(part, "k="); ok {
			k = v
		}
	}
	kb, err := base64.RawURLEncoding.DecodeString(k)
	if err != nil {
		return nil, "", fmt.Errorf("vapid k: %w", err)
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), kb)
	if err != nil {
		return nil, "", fmt.Errorf("vapid k: %w", err)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, "", errors.New("vapid t: not a JWT")
	}
	var head map[string]any
	if err := decodeJSON(parts[0], &head); err != nil || head["alg"] != "ES256" {
		return nil, "", fmt.Errorf("vapid JWT header %v (%v): want alg ES256", head, err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return nil, "", errors.New("vapid JWT signature: want 64 bytes r‖s")
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(pub, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return nil, "", errors.New("vapid JWT: the signature is not k's")
	}
	var claims map[string]any
	if err := decodeJSON(parts[1], &claims); err != nil {
		return nil, "", fmt.Errorf("vapid JWT claims: %w", err)
	}
	if claims["aud"] != origin {
		return nil, "", fmt.Errorf("vapid JWT aud %v, want %s", claims["aud"], origin)
	}
	exp, _ := claims["exp"].(float64)
	if now := float64(time.Now().Unix()); exp <= now || exp > now+24*3600 {
		return nil, "", fmt.Errorf("vapid JWT exp %v: want within 24 h from now", claims["exp"])
	}
	if s, _ := claims["sub"].(string); !strings.HasPrefix(s, "mailto:") && !strings.HasPrefix(s, "https://") {
		return nil, "", fmt.Errorf("vapid JWT sub %q: want mailto: or https://", s)
	}
	return claims, k, nil
}

func decodeJSON(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Decrypt decrypts an aes128gcm push body (RFC 8291, one record) for the
// subscription of private key key and auth secret secret.
func Decrypt(key *ecdh.PrivateKey, secret, body []byte) ([]byte, error) {
	if len(body) < 21 {
		return nil, errors.New("decrypt: body shorter than its header")
	}
	salt, rs, idlen := body[:16], binary.BigEndian.Uint32(body[16:20]), int(body[20])
	if len(body) < 21+idlen || rs < 18 {
		return nil, errors.New("decrypt: bad header")
	}
	asKey, err := ecdh.P256().NewPublicKey(body[21 : 21+idlen])
	if err != nil {
		return nil, fmt.Errorf("decrypt: keyid: %w", err)
	}
	record := body[21+idlen:]
	if len(record) > int(rs) {
		return nil, errors.New("decrypt: more than one record")
	}
	shared, err := key.ECDH(asKey)
	if err != nil {
		return nil, fmt.Errorf("decrypt: %w", err)
	}
	info := append([]byte("WebPush: info\x00"), key.PublicKey().Bytes()...)
	info = append(info, asKey.Bytes()...)
	ikm, err := hkdf.Key(sha256.New, shared, secret, string(info), 32)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	plain, err := gcm.Open(nil, nonce, record, nil)
	if err != nil {
		return nil, fmt.Errorf("decrypt: %w", err)
	}
	plain = bytes.TrimRight(plain, "\x00")
	if len(plain) == 0 || plain[len(plain)-1] != 2 {
		return nil, errors.New("decrypt: no last record's delimiter 0x02")
	}
	return plain[:len(plain)-1], nil
}

// Pushes returns the pushes taken so far.
func (r *Receiver) Pushes() []Push {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Push(nil), r.pushes...)
}

// Errors returns what was wrong with the requests refused so far.
func (r *Receiver) Errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// Wait waits up to 10 s for n pushes and returns them; it fails the
// test on a request that was not a valid push.
func (r *Receiver) Wait(t testing.TB, n int) []Push {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if errs := r.Errors(); len(errs) > 0 {
			t.Fatalf("push endpoint: a request is not a valid push: %v", errs)
		}
		if p := r.Pushes(); len(p) >= n {
			return p
		}
		select {
		case <-r.got:
		case <-deadline:
			t.Fatalf("push endpoint: got %d pushes in 10 s, want %d", len(r.Pushes()), n)
		}
	}
}
