//! The protobuf codec of the fusebox services: prost's, except that a
//! message that does not decode is the sender's fault. It answers
//! INVALID_ARGUMENT naming the field (`key: is not valid UTF-8`), where
//! prost's codec answers INTERNAL.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf, EncodeBuf};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// The codec named by `build.rs` for every generated client and server.
#[derive(Debug)]
pub struct Codec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = Encoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        Encoder(ProstEncoder::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(PhantomData)
    }
}

/// Prost's encoder.
#[derive(Debug)]
pub struct Encoder<T>(ProstEncoder<T>);

impl<T: Message> tonic::codec::Encoder for Encoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        self.0.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        tonic::codec::Encoder::buffer_settings(&self.0)
    }
}

/// Prost's decoding, with errors that name the field.
#[derive(Debug)]
pub struct Decoder<U>(PhantomData<fn() -> U>);

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(problem_of(&e.to_string())))
    }
}

/// `field.path: problem` from prost's text of a decode error, which reads
/// `failed to decode Protobuf message: Inner.field: Outer.field: what`
/// (innermost field first).
pub fn problem_of(text: &str) -> String {
    let mut rest = text
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(text);
    let mut fields = Vec::new();
    while let Some((head, tail)) = rest.split_once(": ") {
        match head.split_once('.') {
            Some((message, field))
                if !message.is_empty()
                    && !field.is_empty()
                    && !head.contains(char::is_whitespace) =>
            {
                fields.push(field);
                rest = tail;
            }
            _ => break,
        }
    }
    fields.reverse();
    let field = if fields.is_empty() {
        "request".to_owned()
    } else {
        fields.join(".")
    };
    let what = if rest.contains("not UTF-8") {
        "is not valid UTF-8; send text in UTF-8".to_owned()
    } else {
        format!("is not valid protobuf ({rest}); check the client's generated code")
    };
    format!("{field}: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_error_names_the_field_outermost_first() {
        assert_eq!(
            problem_of("failed to decode Protobuf message: AcquireRequest.key: invalid string value: data is not UTF-8 encoded"),
            "key: is not valid UTF-8; send text in UTF-8"
        );
        assert_eq!(
            problem_of("failed to decode Protobuf message: PolicyRule.match: SetPolicyRequest.rule: invalid string value: data is not UTF-8 encoded"),
            "rule.match: is not valid UTF-8; send text in UTF-8"
        );
        assert_eq!(
            problem_of("failed to decode Protobuf message: invalid varint"),
            "request: is not valid protobuf (invalid varint); check the client's generated code"
        );
    }

    #[test]
    fn invalid_utf8_in_a_string_field_is_the_senders_fault() {
        // Field 1 (key), length-delimited, two bytes that are not UTF-8.
        let bytes = [0x0a, 0x02, 0xff, 0xfe];
        let e = crate::v1::AcquireRequest::decode(&bytes[..]).unwrap_err();
        assert_eq!(
            problem_of(&e.to_string()),
            "key: is not valid UTF-8; send text in UTF-8"
        );
    }
}
