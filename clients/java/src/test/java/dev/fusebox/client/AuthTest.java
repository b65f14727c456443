package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The token and TLS options against a real server. */
class AuthTest {
  static final String TOKEN = "s3cret-token-for-the-java-client-tests";

  @TempDir Path tmp;

  @Test
  void tokenIsSent() throws Exception {
    String cfg =
        TestServer.config(
            tmp,
            "[auth]\n[[auth.token]]\nname = \"admin\"\nrole = \"admin\"\nenv = \"FUSEBOX_JAVA_TEST_TOKEN\"\n");
    try (TestServer s = TestServer.start(Map.of("FUSEBOX_JAVA_TEST_TOKEN", TOKEN), "127.0.0.1:0", "--config", cfg);
        FuseboxClient without = FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).build();
        FuseboxClient with = FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).token(TOKEN).build()) {
      FuseboxRequestException e = assertThrows(FuseboxRequestException.class, () -> without.guard("k", () -> "ran"));
      assertEquals(Status.Code.UNAUTHENTICATED, e.status().getCode());
      assertEquals("ran", with.guard("k", () -> "ran"));
      GuardTest.flush(with);
      assertEquals(1, with.stats().completed());
    }
  }

  /**
   * A key pair and a self-signed certificate for localhost, made by keytool (RSA: the server
   * cannot read a PKCS#8 EC key without its public key, which is how Java writes one).
   */
  Path[] selfSigned(String name, String... ext) throws Exception {
    Path store = tmp.resolve(name + ".p12");
    List<String> cmd = new java.util.ArrayList<>(List.of(
        Path.of(System.getProperty("java.home"), "bin", "keytool").toString(),
        "-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-alias", name,
        "-keystore", store.toString(), "-storetype", "PKCS12", "-storepass", "changeit",
        "-dname", "CN=localhost", "-validity", "1"));
    for (String e : ext) {
      cmd.add("-ext");
      cmd.add(e);
    }
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try (InputStream in = p.getInputStream()) {
      in.transferTo(out);
    }
    assertEquals(0, p.waitFor(), out.toString(StandardCharsets.UTF_8));
    KeyStore ks = KeyStore.getInstance("PKCS12");
    try (FileInputStream in = new FileInputStream(store.toFile())) {
      ks.load(in, "changeit".toCharArray());
    }
    Certificate cert = ks.getCertificate(name);
    java.security.Key key = ks.getKey(name, "changeit".toCharArray());
    Path certFile = tmp.resolve(name + "-cert.pem");
    Path keyFile = tmp.resolve(name + "-key.pem");
    pem(certFile, "CERTIFICATE", cert.getEncoded());
    pem(keyFile, "PRIVATE KEY", key.getEncoded());
    return new Path[] {certFile, keyFile};
  }

  static void pem(Path f, String type, byte[] der) throws IOException {
    String body = Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII)).encodeToString(der);
    Files.writeString(f, "-----BEGIN " + type + "-----\n" + body + "\n-----END " + type + "-----\n");
  }

  @Test
  void tlsWithAPrivateCa() throws Exception {
    Path[] server = selfSigned("server", "SAN=dns:localhost,ip:127.0.0.1", "BC:c=ca:true");
    try (TestServer s = TestServer.start(Map.of(), "127.0.0.1:0", "--tls-cert", server[0].toString(), "--tls-key", server[1].toString());
        FuseboxClient c =
            FuseboxClient.builder(s.addr)
                .tlsFromFiles(server[0].toString(), null, null, "localhost")
                .deadline(Duration.ofSeconds(2))
                .build();
        FuseboxClient plain = FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).build()) {
      Admission a = c.guard("k", () -> FuseboxClient.admission().orElseThrow());
      assertFalse(a.failedOpen());
      assertTrue(a.ticket() != null);
      GuardTest.flush(c);
      assertEquals(1, c.stats().completed());
      Admission p = plain.guard("k", () -> FuseboxClient.admission().orElseThrow());
      assertTrue(p.failedOpen(), "a plaintext client cannot reach a TLS server");
      assertNull(p.ticket());
    }
  }

  @Test
  void mutualTls() throws Exception {
    Path[] server = selfSigned("server", "SAN=dns:localhost,ip:127.0.0.1", "BC:c=ca:true");
    Path[] client = selfSigned("client", "EKU=clientAuth");
    try (TestServer s =
            TestServer.start(
                Map.of(), "127.0.0.1:0",
                "--tls-cert", server[0].toString(), "--tls-key", server[1].toString(),
                "--tls-client-ca", client[0].toString());
        FuseboxClient with =
            FuseboxClient.builder(s.addr)
                .tlsFromFiles(server[0].toString(), client[0].toString(), client[1].toString(), "localhost")
                .deadline(Duration.ofSeconds(2))
                .build();
        FuseboxClient without =
            FuseboxClient.builder(s.addr)
                .tlsFromFiles(server[0].toString(), null, null, "localhost")
                .deadline(Duration.ofSeconds(2))
                .build()) {
      assertFalse(with.guard("k", () -> FuseboxClient.admission().orElseThrow()).failedOpen());
      assertTrue(without.guard("k", () -> FuseboxClient.admission().orElseThrow()).failedOpen(),
          "without a client certificate the server does not answer");
    }
  }
}
