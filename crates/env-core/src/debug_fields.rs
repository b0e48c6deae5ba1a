//! [`debug_fields!`](crate::debug_fields): a `Debug` that shows only some
//! fields.

/// Implements `Debug` for a struct as `Name { a: …, b: … }` with only the
/// fields named, in that order: for types that hold shared data (a corpus,
/// a search index) or handles too large or opaque to print.
///
/// ```
/// struct Store {
///     name: String,
///     bytes: Vec<u8>,
/// }
/// agentrl_env_core::debug_fields!(Store { name });
///
/// let s = Store { name: "a".into(), bytes: vec![0; 1 << 20] };
/// assert_eq!(format!("{s:?}"), r#"Store { name: "a" }"#);
/// ```
#[macro_export]
macro_rules! debug_fields {
    ($name:ident { $($field:ident),+ $(,)? }) => {
        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    $(.field(stringify!($field), &self.$field))+
                    .finish()
            }
        }
    };
}
