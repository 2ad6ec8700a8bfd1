use super::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn key() -> SecretsKey {
    SecretsKey::generate().expect("a key")
}

/// Random bytes, to make the same key twice.
fn bytes() -> [u8; KEY_LEN] {
    let mut bytes = [0u8; KEY_LEN];
    getrandom::fill(&mut bytes).expect("randomness");
    bytes
}

fn keyring() -> Keyring {
    Keyring::with_key(key())
}

#[test]
fn a_sealed_secret_opens_to_itself_and_shows_nothing_of_it() {
    let keys = keyring();
    let place = ENDPOINT_SECRET.at(7);
    let sealed = keys.seal(place, SECRET).expect("sealed");
    assert!(sealed.starts_with(&format!("enc:v1:{}:", keys.current_id().expect("a key"))));
    for part in [SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_"] {
        assert!(!sealed.contains(part), "{sealed}");
    }
    assert_eq!(keys.open(place, &sealed).expect("opens"), SECRET);
    // A fresh nonce each time: the same secret never seals the same twice.
    assert_ne!(keys.seal(place, SECRET).expect("sealed"), sealed);
    assert_eq!(keys.state_of(&sealed), Stored::Current);
}

#[test]
fn plaintext_reads_as_it_is_and_no_key_stores_plaintext() {
    let place = SOURCE_SECRET.at(1);
    assert_eq!(keyring().open(place, SECRET).expect("plaintext"), SECRET);
    let none = Keyring::none();
    assert!(!none.seals());
    assert_eq!(none.seal(place, SECRET).expect("as it is"), SECRET);
    assert_eq!(none.state_of(SECRET), Stored::Plaintext);
    assert_eq!(
        none.seal(place, "enc:v1:whatever").expect_err("ambiguous"),
        SealError::LooksSealed
    );
    // With a key, even such a secret round-trips.
    let keys = keyring();
    let odd = keys.seal(place, "enc:v1:odd").expect("sealed");
    assert_eq!(keys.open(place, &odd).expect("opens"), "enc:v1:odd");
}

#[test]
fn another_key_does_not_open_and_says_which_key_is_needed() {
    let sealer = keyring();
    let id = sealer.current_id().expect("a key").to_owned();
    let place = ENDPOINT_NATS_CREDENTIALS.at(3);
    let sealed = sealer.seal(place, "{\"token\":\"t0ken\"}").expect("sealed");

    let error = Keyring::none().open(place, &sealed).expect_err("no key");
    assert_eq!(error, OpenError::NoKey { key_id: id.clone() });
    assert!(error.is_missing_key());
    assert!(
        error.to_string().contains("SECRETS_KEY is not set"),
        "{error}"
    );

    let other = keyring();
    let error = other.open(place, &sealed).expect_err("wrong key");
    assert!(error.is_missing_key());
    let shown = error.to_string();
    assert!(
        shown.contains(&id) && shown.contains("SECRETS_KEY is wrong"),
        "{shown}"
    );
    assert!(!shown.contains("t0ken"), "{shown}");
    assert_eq!(other.state_of(&sealed), Stored::Unknown(&id));
}

#[test]
fn the_key_is_chosen_by_the_id_in_the_value() {
    let old_bytes = bytes();
    let old = SecretsKey::from_bytes(&old_bytes).expect("a key");
    let new = key();
    let (old_id, new_id) = (old.id().to_owned(), new.id().to_owned());
    let place = SOURCE_PREVIOUS_SECRET.at(11);
    let under_old = Keyring::with_key(SecretsKey::from_bytes(&old_bytes).expect("a key"))
        .seal(place, SECRET)
        .expect("sealed");
    let rotating = Keyring::new(Some(new), Some(old)).expect("a rotation");
    assert_eq!(rotating.current_id(), Some(new_id.as_str()));
    assert_eq!(rotating.previous_id(), Some(old_id.as_str()));
    assert_eq!(
        rotating.open(place, &under_old).expect("previous opens"),
        SECRET
    );
    assert_eq!(rotating.state_of(&under_old), Stored::Previous);
    // New values go under the current key.
    let fresh = rotating.seal(place, SECRET).expect("sealed");
    assert_eq!(key_id_of(&fresh), Some(new_id.as_str()));
    assert_eq!(rotating.state_of(&fresh), Stored::Current);
}

#[test]
fn a_changed_byte_or_another_place_does_not_open() {
    let keys = keyring();
    let place = ENDPOINT_SECRET.at(5);
    let sealed = keys.seal(place, SECRET).expect("sealed");
    let id = keys.current_id().expect("a key").to_owned();
    let does_not_open = OpenError::DoesNotOpen { key_id: id };

    let (head, body) = sealed.rsplit_once(':').expect("a body");
    let mut bytes = STANDARD.decode(body).expect("base64");
    for at in [0, NONCE_LEN, bytes.len() - 1] {
        bytes[at] ^= 0x01;
        let tampered = format!("{head}:{}", STANDARD.encode(&bytes));
        assert_eq!(keys.open(place, &tampered), Err(does_not_open.clone()));
        bytes[at] ^= 0x01;
    }
    for elsewhere in [
        ENDPOINT_SECRET.at(6),
        ENDPOINT_PREVIOUS_SECRET.at(5),
        SOURCE_SECRET.at(5),
    ] {
        assert_eq!(keys.open(elsewhere, &sealed), Err(does_not_open.clone()));
    }
    let moved = OpenError::DoesNotOpen { key_id: "x".into() }
        .about("endpoint \"erp\"", ENDPOINT_SECRET)
        .to_string();
    assert!(
        moved.starts_with("the signing secret of endpoint \"erp\" cannot be read"),
        "{moved}"
    );
}

#[test]
fn cut_or_mangled_values_are_malformed_not_plaintext() {
    let keys = keyring();
    let place = ENDPOINT_SECRET.at(1);
    let sealed = keys.seal(place, SECRET).expect("sealed");
    let id = keys.current_id().expect("a key");
    for broken in [
        "enc:v1:".to_owned(),
        format!("enc:v1:{id}"),
        format!("enc:v1:{id}:not base64!"),
        format!("enc:v1:{id}:AAAA"),
        format!("enc:v1:zz{}:{}", &id[2..], &sealed[16..]),
        sealed[..sealed.len() - 8].to_owned(),
    ] {
        assert!(
            matches!(
                keys.open(place, &broken),
                Err(OpenError::Malformed | OpenError::DoesNotOpen { .. })
            ),
            "{broken}"
        );
    }
}

#[test]
fn a_previous_key_needs_a_current_one_and_must_differ() {
    assert_eq!(
        Keyring::new(None, Some(key())).expect_err("previous alone"),
        KeyError::PreviousWithoutCurrent
    );
    let same = bytes();
    let one = SecretsKey::from_bytes(&same).expect("a key");
    let again = SecretsKey::from_bytes(&same).expect("a key");
    assert_eq!(
        Keyring::new(Some(one), Some(again)).expect_err("the same key"),
        KeyError::SameAsCurrent
    );
    assert!(!Keyring::new(None, None).expect("no keys").seals());
    let shown = format!("{:?}", keyring());
    assert!(shown.starts_with("Keyring { current: Some("), "{shown}");
}
