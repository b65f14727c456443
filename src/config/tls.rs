//! `[tls]`: the server's certificate and key, and mutual TLS. Validated
//! into [`TlsConfig`]; the `--tls-*` flags go over it ([`resolve`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::ConfigError;
use crate::tls::{ClientAuth, TlsConfig};

/// `[tls]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: Option<String>,
    /// The server's private key (PEM).
    pub key: Option<String>,
    /// The CAs that sign client certificates (PEM); set for mutual TLS.
    pub client_ca: Option<String>,
    /// `"required"` (the default with `client_ca`) or `"optional"`.
    pub client_auth: Option<ClientAuth>,
    /// Serve the HTTP port over TLS too (default true).
    pub http: Option<bool>,
}

impl TlsSpec {
    /// Validates `[tls]`; relative paths resolve against `base` (the config
    /// file's directory). The files themselves are read when the server starts.
    pub fn validate(&self, base: Option<&Path>) -> Result<TlsConfig, ConfigError> {
        let invalid = |field: &str, problem: &str| ConfigError::Invalid {
            rule: "[tls]".into(),
            field: field.into(),
            problem: problem.into(),
        };
        let path = |field: &str, value: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
            match value.as_deref() {
                None => Ok(None),
                Some("") => Err(invalid(
                    field,
                    "must not be empty: give the path of a PEM file",
                )),
                Some(p) => Ok(Some(match base {
                    Some(dir) if Path::new(p).is_relative() => dir.join(p),
                    _ => PathBuf::from(p),
                })),
            }
        };
        let cert = path("cert", &self.cert)?.ok_or_else(|| {
            invalid(
                "cert",
                "is missing: give the PEM file of the server's certificate chain",
            )
        })?;
        let key = path("key", &self.key)?.ok_or_else(|| {
            invalid(
                "key",
                "is missing: give the PEM file of the server's private key",
            )
        })?;
        let client_ca = path("client_ca", &self.client_ca)?;
        if self.client_auth.is_some() && client_ca.is_none() {
            return Err(invalid(
                "client_auth",
                "needs client_ca (the PEM bundle of the CAs that sign client certificates); set client_ca or remove client_auth",
            ));
        }
        Ok(TlsConfig {
            cert,
            key,
            client_ca,
            client_auth: self.client_auth.unwrap_or_default(),
            http: self.http.unwrap_or(true),
        })
    }
}

/// The TLS settings: `[tls]` of the config (`from_file`, validated with the
/// rest of it), then the `--tls-*` flags over it: a flag wins over its
/// field; `--tls-cert` and `--tls-key` without `[tls]` turn TLS on.
pub fn resolve(
    from_file: Option<TlsConfig>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<TlsConfig>, ConfigError> {
    let flag = |name: &str, problem: &str| ConfigError::Invalid {
        rule: "the command line".into(),
        field: name.into(),
        problem: problem.into(),
    };
    match (from_file, cert, key) {
        (None, None, None) if client_ca.is_some() => Err(flag(
            "--tls-client-ca",
            "needs TLS: pass --tls-cert and --tls-key too, or set [tls] in the config",
        )),
        (None, None, None) => Ok(None),
        (None, Some(cert), Some(key)) => Ok(Some(TlsConfig {
            cert,
            key,
            client_ca,
            client_auth: ClientAuth::Required,
            http: true,
        })),
        (None, Some(_), None) => Err(flag(
            "--tls-cert",
            "needs --tls-key (the server's private key)",
        )),
        (None, None, Some(_)) => Err(flag(
            "--tls-key",
            "needs --tls-cert (the server's certificate chain)",
        )),
        (Some(mut tls), cert, key) => {
            if let Some(cert) = cert {
                tls.cert = cert;
            }
            if let Some(key) = key {
                tls.key = key;
            }
            if client_ca.is_some() {
                tls.client_ca = client_ca;
            }
            Ok(Some(tls))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    #[test]
    fn tls_settings_resolve_paths_against_the_config_file_and_flags_win() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("fusebox.toml");
        std::fs::write(
            &path,
            "[tls]\ncert = \"certs/server.pem\"\nkey = \"/etc/key.pem\"\nclient_ca = \"ca.pem\"\n",
        )
        .expect("written");
        let file = Config::load(&path).expect("a valid config").tls;
        let tls = resolve(file.clone(), None, None, None)
            .expect("valid")
            .expect("TLS is on");
        assert_eq!(tls.cert, dir.path().join("certs/server.pem"));
        assert_eq!(tls.key, std::path::PathBuf::from("/etc/key.pem"));
        assert_eq!(tls.client_ca, Some(dir.path().join("ca.pem")));
        assert_eq!(tls.client_auth, ClientAuth::Required);
        assert!(tls.http);
        let tls = resolve(file, Some("/x/c.pem".into()), None, None)
            .expect("valid")
            .expect("TLS is on");
        assert_eq!(tls.cert, std::path::PathBuf::from("/x/c.pem"));

        assert_eq!(resolve(None, None, None, None).expect("valid"), None);
        let e = resolve(None, Some("c.pem".into()), None, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("the command line: --tls-cert: needs --tls-key"),
            "{e}"
        );
        let e = resolve(None, None, None, Some("ca.pem".into())).unwrap_err();
        assert!(e.to_string().contains("--tls-client-ca"), "{e}");
    }

    #[test]
    fn a_bad_tls_section_names_the_field() {
        for (text, expected) in [
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nverify = true\n",
                "[tls]: verify: unknown field",
            ),
            ("[tls]\nkey = \"k\"\n", "[tls]: cert: is missing"),
            (
                "[tls]\ncert = \"\"\nkey = \"k\"\n",
                "[tls]: cert: must not be empty",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_auth = \"optional\"\n",
                "[tls]: client_auth: needs client_ca",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"a\"\nclient_auth = \"maybe\"\n",
                "[tls]: client_auth",
            ),
        ] {
            let e = Config::parse(text, "test.toml").unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }
}
