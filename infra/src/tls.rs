//! Telling a TLS failure from a network one when PostgreSQL or RabbitMQ cannot be reached.
//!
//! sqlx and lapin both report a failed handshake as an I/O error wrapping rustls's own error;
//! retrying those cannot help (the certificate will not verify any better in a minute), so
//! [`store::StoreError::Tls`](crate::store::StoreError::Tls) and
//! [`topology::BrokerError::Tls`](crate::topology::BrokerError::Tls) report them as the
//! configuration problems they are, with what to check.

use std::error::Error as StdError;

use rustls::{AlertDescription, CertificateError};

/// What went wrong, in an operator's words, when a rustls error is somewhere in `err`'s chain
/// (an I/O error's inner error counts: `io::Error::source` skips it).
pub fn certificate_problem(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(tls) = as_rustls(e) {
            return Some(describe(tls));
        }
        current = e.source();
    }
    None
}

fn as_rustls<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let io = e.downcast_ref::<std::io::Error>()?;
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the server's certificate does not name the host connected to ({e}): connect by a \
             name the certificate carries, or use sslmode=verify-ca for PostgreSQL"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => format!("the server's certificate is outside its validity period ({e})"),
        rustls::Error::InvalidCertificate(_) => format!(
            "the server's certificate does not verify against the trusted CA certificates \
             ({e}): check the configured CA file"
        ),
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => format!(
            "the server requires a client certificate and none was sent ({e}): configure one"
        ),
        rustls::Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => format!(
            "the server does not accept the client certificate ({e}): it must be signed by a \
             CA the server trusts"
        ),
        rustls::Error::AlertReceived(AlertDescription::HandshakeFailure) => format!(
            "the server refused the TLS handshake ({e}): it may require a client certificate"
        ),
        _ => format!("the TLS handshake failed ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_rustls_inside_an_io_error_and_says_what_to_check() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let problem = certificate_problem(&io).expect("recognised");
        assert!(problem.contains("does not verify"), "{problem}");
        assert!(problem.contains("CA file"), "{problem}");

        let refused = std::io::Error::other(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired,
        ));
        let problem = certificate_problem(&refused).expect("recognised");
        assert!(problem.contains("client certificate"), "{problem}");
    }

    #[test]
    fn plain_network_errors_are_not_tls_problems() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(certificate_problem(&io), None);
    }
}
